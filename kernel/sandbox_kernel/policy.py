"""The sandbox policy: one frozen dataclass, secure defaults, units in the names.

Every policy option is defined once, here, as a field of :class:`Policy` made
with :func:`option`: its default, its help, its unit, who enforces it (the
backend or the proxy), its accepted values and how an override may tighten it.
Everything else is derived from that definition (:data:`OPTIONS`): the
kernel's traits (:mod:`sandbox_kernel.options`), the command-line flags of
``sandbox-kernel install`` and ``pool``, :meth:`Policy.validate`,
:meth:`Policy.tighten`, the warm pool's key and ``docs/configuration.md``.

The operator's policy comes from traitlets configuration (kernelspec argv,
``sandbox_kernel_config.py``: ``docs/configuration.md``); a notebook or an agent may only *tighten* it
(:meth:`Policy.tighten`), as gVisor's flag-override allowlist does.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import PolicyError

#: Environment variable names that may never be set inside a sandbox, whatever
#: the operator configures (the frontend's signing key and cloud credentials).
FORBIDDEN_ENV = frozenset(
    {"JPY_SESSION_NAME", "E2B_API_KEY", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "JUPYTER_TOKEN"}
)

#: Who enforces an option: the backend, inside or around the sandbox (a backend
#: declares which of these it enforces: ``SandboxBackend.enforced_fields``), or the
#: proxy, the same way on every backend.
Scope = Literal["sandbox", "proxy"]
#: How an override may tighten an option: ``"smaller"`` (a smaller number; where 0
#: means off, turning it on counts as tighter and turning it off does not),
#: ``"choice"`` (a choice listed earlier in ``choices``, which go tightest first),
#: ``"subset"`` (a subset of the operator's list).  None: the operator's alone.
Tighten = Literal["smaller", "choice", "subset"]


@dataclass(frozen=True)
class OptionMeta:
    """What a :class:`Policy` field means, beyond its name, type and default.

    Attributes
    ----------
    help : str
        One or two sentences for an operator, without the unit or the default
        (both are added where the help is shown).
    unit : str
        ``"MiB"``, ``"s"``, ``"cores"``, ``"bytes"``...; empty for none.
    scope : {"sandbox", "proxy"}
        See :data:`Scope`.
    minimum : int, optional
        Integers only: the smallest accepted value (default 1).
    why : str
        Integers only: why the minimum, said after it ("for a Python kernel").
    zero_is_off : bool
        Numbers only: 0 disables the feature (and is accepted).
    choices : tuple of str
        Strings only: the accepted values, tightest first.
    tighten : {"smaller", "choice", "subset"} or None
        See :data:`Tighten`.
    alias : str
        A second command-line spelling (``--allow-domain``: the singular of a
        repeatable flag); empty for none.
    """

    help: str
    unit: str = ""
    scope: Scope = "proxy"
    minimum: int | None = None
    why: str = ""
    zero_is_off: bool = False
    choices: tuple[str, ...] = ()
    tighten: Tighten | None = None
    alias: str = ""


def option(default: Any, help: str, **meta: Any) -> Any:
    """A :class:`Policy` field with its :class:`OptionMeta` (keyword arguments)."""
    return field(default=default, metadata={"option": OptionMeta(help=help, **meta)})


@dataclass(frozen=True)
class Policy:
    """What a sandbox may do and use.

    Every field is an option; its meaning, unit and default are listed below
    and in ``docs/configuration.md``, both generated from the field's
    :class:`OptionMeta`.
    """

    ro_paths: tuple[str, ...] = option(
        (), "Extra host directories mounted read-only at the same path inside the sandbox.",
        scope="sandbox")
    memory_mib: int = option(
        4096, "Memory limit of the whole sandbox.", unit="MiB", scope="sandbox", minimum=128,
        why="for a Python kernel", tighten="smaller")
    cpu_cores: float = option(
        2.0, "CPU quota (1.5 = 150 % of one core).", unit="cores", scope="sandbox", tighten="smaller")
    pids_max: int = option(
        1024, "Processes and threads the sandbox may hold at once.", scope="sandbox", minimum=64,
        why="the runtime's own threads count", tighten="smaller")
    scratch_mib: int = option(
        1024, "Size of the writable scratch space (home directory and /tmp).", unit="MiB",
        scope="sandbox", tighten="smaller")
    cell_timeout_s: float = option(
        0.0, "Wall time of one cell before it is interrupted; 0 = no limit.", unit="s",
        zero_is_off=True, tighten="smaller")
    interrupt_grace_s: float = option(
        5.0, "After a timeout interrupt, how long a cell may take to stop before the "
        "interpreter is restarted.", unit="s")
    lifetime_s: float = option(
        24 * 3600.0, "Longest life of one sandbox; also caps the dead-man's switch granted to "
        "cloud backends, refreshed while the proxy lives.", unit="s", scope="sandbox",
        tighten="smaller")
    network: str = option(
        "none", "Egress. none: no interface but loopback. allowlist: HTTP(S) through the kernel's "
        "egress proxy to the names in allow_domains on allow_ports only, each attempt shown in its "
        "cell and logged (docs/security.md, 'Egress').", scope="sandbox",
        choices=("none", "allowlist"), tighten="choice")
    allow_domains: tuple[str, ...] = option(
        (), "With network=allowlist: host names the sandbox may reach ('pypi.org', "
        "'*.example.org' for every name below example.org, an IP literal only if public). "
        "None: nothing.", scope="sandbox", tighten="subset", alias="--allow-domain")
    allow_ports: tuple[int, ...] = option(
        (443, 80), "With network=allowlist: TCP ports the sandbox may reach on allowed names.",
        scope="sandbox", tighten="subset", alias="--allow-port")
    egress_resolve: tuple[tuple[str, str], ...] = option(
        (), "Operator's override of name resolution for egress, as curl --resolve: name -> 'IP' or "
        "'IP:PORT' ('[::1]:8080'). The one way to reach a loopback or private address; the name "
        "must still be in allow_domains.", scope="sandbox")
    max_egress_connections_per_cell: int = option(
        1000, "Egress connections one cell may open (allowed or refused) before further ones are "
        "refused.", scope="sandbox", tighten="smaller")
    max_egress_bytes_per_cell: int = option(
        1024 * 1024 * 1024, "Egress bytes, both directions, one cell may move before its "
        "connections are cut.", unit="bytes", scope="sandbox", tighten="smaller")
    pause_after_s: float = option(
        600.0, "Idle time before the sandbox is frozen (CPU freed, memory kept); 0 = never.",
        unit="s", zero_is_off=True, tighten="smaller")
    checkpoint_after_s: float = option(
        3600.0, "Idle time before the sandbox is checkpointed to disk (memory freed, state kept; "
        "where the backend cannot, it is stopped with a notice); 0 = never.", unit="s",
        zero_is_off=True, tighten="smaller")
    stop_after_s: float = option(
        0.0, "Idle time before the sandbox is stopped (state lost, the user is told); 0 = never.",
        unit="s", zero_is_off=True, tighten="smaller")
    max_output_bytes_per_cell: int = option(
        64 * 1024 * 1024, "Output one cell may send to the frontend before the rest is dropped "
        "with a notice.", unit="bytes", tighten="smaller")
    max_output_msgs_per_s: int = option(
        2000, "IOPub messages relayed per second before further ones are dropped.",
        unit="messages/s", tighten="smaller")
    max_frame_bytes: int = option(
        64 * 1024 * 1024, "Largest single frame accepted from the sandbox; a longer one counts "
        "as a corrupted channel.", unit="bytes")
    max_file_transfer_bytes: int = option(
        256 * 1024 * 1024, "Largest file moved into or out of the sandbox by the file comm "
        "(sandbox_kernel.files) or the workspace copy of cloud backends.", unit="bytes",
        tighten="smaller")
    output_policy: str = option(
        "sanitize", "sanitize: outputs, widget state and comm messages may not run script in "
        "the browser or make it fetch anything (docs/security.md); trust: relay as produced.",
        choices=("sanitize", "trust"), tighten="choice")
    trusted_widget_modules: tuple[str, ...] = option(
        (), "Widget modules (e.g. 'jupyter-matplotlib') whose frontend code the operator "
        "trusts: their widgets are relayed unfiltered under output_policy=sanitize. None: only "
        "ipywidgets' own widgets, filtered.", tighten="subset")
    trusted_comm_targets: tuple[str, ...] = option(
        (), "Comm targets whose messages from the sandbox are relayed unfiltered under "
        "output_policy=sanitize. None: only inert JSON passes on unknown targets.",
        tighten="subset")
    workspace: str = option(
        "none", "The notebook's folder (workspace_path) as the sandbox sees it: none (not at all), "
        "ro (read-only) or rw (read-write), at /home/sandbox/work, the interpreter's working "
        "directory. Local sandboxes mount it; E2B and Modal get a copy (rw: copied back on request "
        "and at shutdown). Refused at start for /, a home directory, a system directory or a "
        "folder holding credentials (docs/security.md).", scope="sandbox",
        choices=("none", "ro", "rw"), tighten="choice")
    workspace_path: str = option(
        "", "Host folder exposed by workspace; empty: the kernel's working directory (Jupyter "
        "Server starts kernels in the notebook's folder).", scope="sandbox")
    env: tuple[tuple[str, str], ...] = option(
        (), "Environment variables set inside the sandbox, beyond the fixed base (HOME, PATH, "
        "LANG...); host variables are never inherited.", scope="sandbox")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field: its type and range from its :class:`OptionMeta`, then
        the rules of ``ro_paths`` and ``env``.

        Raises
        ------
        PolicyError
            Naming the first bad field and its value.
        """
        for opt in OPTIONS:
            opt.check(getattr(self, opt.name))
        for p in self.ro_paths:
            if not p.startswith("/") or p.rstrip("/") in ("", "/proc", "/sys", "/dev"):
                raise PolicyError("ro_paths", p, "must be absolute and not /, /proc, /sys or /dev")
        if self.workspace_path and (not self.workspace_path.startswith("/") or "\0" in self.workspace_path):
            raise PolicyError("workspace_path", self.workspace_path, "must be an absolute host path "
                              "(empty: the kernel's working directory)")
        for k, v in self.env:
            if not k or "=" in k or "\0" in k or "\0" in v:
                raise PolicyError("env", k, "names must be non-empty, without '=' or NUL")
            if k in FORBIDDEN_ENV:
                raise PolicyError("env", k, "credentials and signing keys never enter a sandbox")
        from .egress.rules import check_egress_options

        check_egress_options(self)

    @property
    def env_dict(self) -> dict[str, str]:
        """:attr:`env` as a dict."""
        return dict(self.env)

    def sandbox_fields(self) -> dict[str, Any]:
        """The fields a backend enforces (scope ``"sandbox"``), by name: what a
        sandbox is made with, so what the warm pool's key hashes."""
        return {o.name: getattr(self, o.name) for o in OPTIONS if o.scope == "sandbox"}

    def tighten(self, overrides: Mapping[str, Any]) -> Policy:
        """Return a copy with ``overrides`` applied, allowing only tighter values.

        What counts as tighter is each field's :attr:`OptionMeta.tighten`.

        Parameters
        ----------
        overrides : mapping
            Field name to new value, e.g. from notebook metadata or an agent.

        Returns
        -------
        Policy

        Raises
        ------
        PolicyError
            If a field is unknown, may not be overridden, has a bad value or
            would be loosened.
        """
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            opt = OPTIONS_BY_NAME.get(name)
            if opt is None or opt.meta.tighten is None:
                raise PolicyError(name, value, "cannot be overridden by a notebook or agent")
            if opt.kind in ("strings", "ints") and isinstance(value, list):
                value = tuple(value)
            opt.check(value)
            opt.check_tighter(getattr(self, name), value)
            changes[name] = value
        return dataclasses.replace(self, **changes)


#: Field type -> kind of option (what trait, flag and checks it gets).
_KINDS: dict[Any, str] = {
    int: "int", float: "float", str: "str",
    tuple[str, ...]: "strings", tuple[int, ...]: "ints", tuple[tuple[str, str], ...]: "mapping",
}


@dataclass(frozen=True)
class Option:
    """One :class:`Policy` field as an option: what every derived form is built from.

    Attributes
    ----------
    name : str
        The field's name, which is also the trait's; the flag is ``--`` plus the
        name with ``-`` for ``_``.
    kind : {"int", "float", "str", "choice", "strings", "ints", "mapping"}
        From the field's type: ``"choice"`` is a ``str`` with ``choices``,
        ``"strings"`` a tuple of str, ``"ints"`` a tuple of int, ``"mapping"`` a
        tuple of (str, str) pairs
        (a dict in configuration).
    default : object
        The field's default.
    meta : OptionMeta
    """

    name: str
    kind: str
    default: Any
    meta: OptionMeta

    @property
    def scope(self) -> Scope:
        return self.meta.scope

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--memory-mib``."""
        return "--" + self.name.replace("_", "-")

    def default_text(self) -> str:
        """The default as an operator reads it: ``4096``, ``0.5``, ``none``."""
        d = self.default
        if isinstance(d, tuple):
            return "none" if not d else ", ".join(map(str, d))
        if isinstance(d, float):
            return f"{d:g}"
        return str(d) if d != "" else "empty"

    def describe(self) -> str:
        """Help, unit and default in one string (a trait's ``help=``, ipykernel style)."""
        unit = f" Unit: {self.meta.unit}." if self.meta.unit else ""
        return f"{self.meta.help}{unit} Default: {self.default_text()}."

    def check(self, v: Any) -> None:
        """Check a value's type and range.

        Raises
        ------
        PolicyError
            Naming this option, the value and what would be accepted.
        """
        m, kind = self.meta, self.kind
        if kind == "int":
            low = 1 if m.minimum is None else m.minimum
            if not isinstance(v, int) or isinstance(v, bool) or (v < low and not (m.zero_is_off and v == 0)):
                if low == 1:
                    raise PolicyError(self.name, v, "must be a positive integer")
                unit = f" {m.unit}" if m.unit else ""
                why = f" ({m.why})" if m.why else ""
                raise PolicyError(self.name, v, f"must be an integer of at least {low}{unit}{why}")
        elif kind == "float":
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if m.zero_is_off and not (ok and v >= 0):
                raise PolicyError(self.name, v, "must be >= 0 (0 disables it)")
            if not m.zero_is_off and not (ok and v > 0):
                raise PolicyError(self.name, v, "must be a positive finite number")
        elif kind in ("str", "choice"):
            if not isinstance(v, str) or (m.choices and v not in m.choices):
                raise PolicyError(self.name, v, f"must be one of {m.choices}" if m.choices else "must be a string")
        elif kind == "strings":
            if not isinstance(v, tuple) or not all(isinstance(s, str) for s in v):
                raise PolicyError(self.name, v, "must be a tuple of strings")
        elif kind == "ints":
            if not isinstance(v, tuple) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
                raise PolicyError(self.name, v, "must be a tuple of integers")
        elif kind == "mapping":
            if not isinstance(v, tuple) or not all(
                    isinstance(kv, tuple) and len(kv) == 2 and all(isinstance(s, str) for s in kv) for kv in v):
                raise PolicyError(self.name, v, "must be a tuple of (name, value) string pairs")

    def check_tighter(self, current: Any, value: Any) -> None:
        """Refuse ``value`` if it loosens ``current`` (see :attr:`OptionMeta.tighten`).

        Raises
        ------
        PolicyError
        """
        how = self.meta.tighten
        if how == "smaller":
            if self.meta.zero_is_off and value == 0 and current != 0:
                raise PolicyError(self.name, value, f"cannot switch off the operator's {self.name}={current}")
            if not (self.meta.zero_is_off and current == 0) and value > current:
                raise PolicyError(self.name, value, f"may only tighten (operator allows at most {current})")
        elif how == "choice":
            if self.meta.choices.index(value) > self.meta.choices.index(current):
                raise PolicyError(self.name, value, f"may only tighten (the operator chose {current!r}; "
                                  f"tighter first: {self.meta.choices})")
        elif how == "subset":
            if not set(value) <= set(current):
                raise PolicyError(self.name, value, f"may only remove entries from the operator's {current}")


def _options() -> tuple[Option, ...]:
    hints = typing.get_type_hints(Policy)
    out = []
    for f in dataclasses.fields(Policy):
        meta = f.metadata["option"]
        kind = _KINDS[hints[f.name]]
        if kind == "str" and meta.choices:
            kind = "choice"
        out.append(Option(f.name, kind, f.default, meta))
    return tuple(out)


#: Every policy option, in field order.
OPTIONS: tuple[Option, ...] = _options()
#: :data:`OPTIONS` by name.
OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def _attributes_doc() -> str:
    """``Policy``'s numpydoc ``Attributes`` section, from :data:`OPTIONS`."""
    types = {"int": "int", "float": "float", "str": "str", "strings": "tuple of str", "ints": "tuple of int",
             "mapping": "tuple of (str, str)"}
    lines = ["", "    Attributes", "    ----------"]
    for o in OPTIONS:
        kind = "{" + ", ".join(map(repr, o.meta.choices)) + "}" if o.kind == "choice" else types[o.kind]
        who = "backend" if o.scope == "sandbox" else "proxy"
        lines += [f"    {o.name} : {kind}", f"        {o.describe()} Enforced by the {who}."]
    return "\n".join(lines) + "\n"


Policy.__doc__ = (Policy.__doc__ or "") + _attributes_doc()
