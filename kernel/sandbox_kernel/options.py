"""The kernel's configuration, derived from the one definition of each option.

Three kinds of options, each defined once:

* **Policy options**, fields of :class:`~sandbox_kernel.policy.Policy`
  (:data:`~sandbox_kernel.policy.OPTIONS`).  Here they become traits of
  ``SandboxKernel`` (:class:`PolicyTraits`, help with unit and default) and
  ``SandboxKernel`` builds its policy from them (:meth:`KernelOptions.build_policy`).
* **Kernel options** (:class:`KernelOptions`): which backend, the proxy's own
  waits, notices.
* **Backend options**: traits of each backend class
  (``--LocalBackend.runtime``, ``--E2BBackend.template``), which the kernel
  builds with ``parent=kernel`` (:meth:`KernelOptions.build_backend`), as
  jupyter_client builds its provisioners.

The command line of ``sandbox-kernel install`` and ``pool`` gets one flag per
trait (:func:`add_trait_flags`), kernelspecs get one ``--Class.name=value`` per
option (:func:`route_options`), and ``docs/configuration.md`` one row
(``scripts/gen_config_docs.py``): adding a ``Policy`` field is the one edit.

Old spellings still work, with a warning in the kernel's log:
``--SandboxKernel.runtime``, ``.python`` and ``.pool_socket`` (now
``LocalBackend`` options) and ``--SandboxKernel.backend_options={...}`` (now one
``--<Backend>.<name>`` each), see :data:`DEPRECATED_ALIASES`.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import types
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from traitlets import Bool, CaselessStrEnum, Dict, Enum, Float, HasTraits, Integer, List, TraitError, TraitType, Unicode

from .backends import load_backend
from .backends.base import seconds_trait
from .channel import PING_AFTER_S, PONG_TIMEOUT_S
from .errors import ConfigError
from .interpreter_config import InterpreterSetup
from .policy import OPTIONS, Option, Policy

if TYPE_CHECKING:
    from .backends.base import SandboxBackend

#: Old ``SandboxKernel`` options that became another class's: name -> ``Class.name``.
#: ``backend_options`` (a dict for the backend in use) is handled beside them.
DEPRECATED_ALIASES = {
    "runtime": "LocalBackend.runtime",
    "python": "LocalBackend.python",
    "pool_socket": "LocalBackend.pool_socket",
}


# ---- policy options as traits ----------------------------------------------------------------


def policy_trait(opt: Option) -> TraitType:
    """The ``SandboxKernel`` trait of one policy option: its kind's trait type, the
    policy's default, and help with unit and default (ipykernel's style)."""
    kw: dict[str, Any] = {"config": True, "help": opt.describe()}
    d = opt.default
    if opt.kind == "int":
        return Integer(d, **kw)
    if opt.kind == "float":
        return Float(d, **kw)
    if opt.kind == "choice":
        return CaselessStrEnum(list(opt.meta.choices), d, **kw)
    if opt.kind == "str":
        return Unicode(d, **kw)
    if opt.kind == "strings":
        return List(Unicode(), list(d), **kw)
    if opt.kind == "ints":
        return List(Integer(), list(d), **kw)
    if opt.kind == "mapping":
        return Dict(value_trait=Unicode(), default_value=dict(d), **kw)
    raise AssertionError(f"no trait for option kind {opt.kind!r}")


def policy_value(opt: Option, value: Any) -> Any:
    """A trait's value as the :class:`Policy` field holds it (lists as tuples, a dict
    as sorted (name, value) pairs)."""
    if opt.kind in ("strings", "ints"):
        return tuple(value)
    if opt.kind == "mapping":
        return tuple(sorted(dict(value).items()))
    return value


#: One trait per policy option; ``SandboxKernel`` inherits them (through :class:`KernelOptions`).
PolicyTraits = types.new_class("PolicyTraits", (HasTraits,),
                               exec_body=lambda ns: ns.update({o.name: policy_trait(o) for o in OPTIONS}))
PolicyTraits.__doc__ = "The policy options as traits, generated from :data:`~sandbox_kernel.policy.OPTIONS`."
PolicyTraits.__module__ = __name__


# ---- the kernel's own options, and building from them ------------------------------------------


class KernelOptions(PolicyTraits):  # type: ignore[misc, valid-type]
    """``SandboxKernel``'s options: the policy's (:class:`PolicyTraits`) and its own.

    A mixin: its traits are configured in ``SandboxKernel``'s section
    (``--SandboxKernel.memory_mib=2048``, ``c.SandboxKernel.start_wait_s = 60``).
    """

    backend = Unicode("local", config=True, help="Sandbox backend: an entry point of the "
                      "'sandbox_kernel.backends' group (local, e2b, modal). Its own options are set "
                      "as --<Class>.<name> (--LocalBackend.runtime=gvisor, --E2BBackend.template=...). "
                      "Default: local.")
    lifecycle_notices = Bool(True, config=True, help="Print a short stderr line on the cell that "
                             "triggered a sandbox start, restart or resume, and while a cell waits "
                             "over 0.5 s for its sandbox (start, wake, restore, memory to restore "
                             "into) show what it waits for in the cell, updated every second and "
                             "cleared before the cell's output. Default: True.")
    forward_ipython_config = Bool(True, config=True, help="Carry IPython configuration meant for the "
                                  "interpreter into the sandbox: --InlineBackend.*, --HistoryManager.*, "
                                  "--IPKernelApp.exec_lines and the like, and the IPython profile's "
                                  "config and startup files (applied inside after each fresh start; "
                                  "nothing is mounted). Default: True.")
    start_wait_s = seconds_trait(120.0, "How long a kernel_info_request on the shell channel waits "
                                 "for the first sandbox, so that its reply carries the sandbox "
                                 "interpreter's language_info (on control it is answered at once).")
    interrupt_timeout_s = seconds_trait(2.0, "How long an interrupt_request waits for the sandbox to "
                                        "take the interrupt before it replies with an error.")
    shutdown_timeout_s = seconds_trait(30.0, "How long a shutdown waits for the sandbox to be "
                                       "removed; what is left is reaped by the local watchdog or the "
                                       "cloud sandbox's own timeout.")
    ping_after_s = seconds_trait(PING_AFTER_S, "While a request is pending, silence from the sandbox "
                                 "before the relay asks the agent whether it is alive.")
    pong_timeout_s = seconds_trait(PONG_TIMEOUT_S, "How long that question may go without any frame "
                                   "in return before the channel is declared dead and the sandbox "
                                   "replaced.")
    snapshots_max = Integer(8, min=1, config=True, help="How many snapshots of this kernel "
                            "(snapshot_request, docs/lifecycle.md) are kept: taking one more removes "
                            "the oldest (the reply names it). All are removed with the kernel. Default: 8.")
    forks_max = Integer(8, min=1, config=True, help="Most new kernels one fork_request (Sandbox.fork(n), "
                        "docs/lifecycle.md) may ask for; more is refused before anything is written. "
                        "Default: 8.")

    # -- old spellings (DEPRECATED_ALIASES): None = not set --
    runtime = Unicode(None, allow_none=True, config=True, help="Deprecated: use LocalBackend.runtime.")
    python = Unicode(None, allow_none=True, config=True, help="Deprecated: use LocalBackend.python.")
    pool_socket = Unicode(None, allow_none=True, config=True,
                          help="Deprecated: use LocalBackend.pool_socket.")
    backend_options = Dict(config=True, help="Deprecated: set each backend option as "
                           "--<Class>.<name> (--E2BBackend.template=...). Default: {}.")

    def build_policy(self) -> Policy:
        """The operator's policy, from the policy traits.

        Raises
        ------
        PolicyError
            Naming the first bad field.
        """
        return Policy(**{o.name: policy_value(o, getattr(self, o.name)) for o in OPTIONS})

    def build_backend(self, policy: Policy, kernel_id: str, log: logging.Logger) -> SandboxBackend:
        """The configured backend, built with ``parent=self`` so that its section of the
        configuration (``--E2BBackend.template=...``) applies.

        Raises
        ------
        BackendNotFound
            If :attr:`backend` names no installed backend.
        ConfigError
            For an unknown or ill-typed backend option, naming it.
        SandboxKernelError
            Whatever else the backend raises when it cannot be set up here (e.g.
            ``RuntimeUnavailable``).
        """
        cls = load_backend(self.backend)
        kwargs = self._old_spellings(cls, log)
        unknown_options(cls, self.config, kwargs)
        try:
            return cls(policy, kernel_id, log=log, parent=self, **kwargs)
        except TraitError as err:
            raise trait_config_error(cls, err, self.config, kwargs) from err

    def warn_unenforced(self, policy: Policy, sandbox: SandboxBackend, log: logging.Logger) -> None:
        """Say, once at start, which fields of ``policy`` the built backend ``sandbox`` leaves
        to its own defaults: a warning for values the operator set, a debug line for
        defaults nobody chose (not noise at every start)."""
        fields = sandbox.check_policy(policy)
        defaults = Policy()
        chosen = [f for f in fields if getattr(policy, f) != getattr(defaults, f)]
        for level, names in ((logging.WARNING, chosen), (logging.DEBUG, [f for f in fields if f not in chosen])):
            if names:
                log.log(level, "the %s backend does not enforce %s; the sandbox's own limits apply "
                        "(sandbox-kernel doctor lists what each backend enforces)", sandbox.name,
                        ", ".join(f"{f}={getattr(policy, f)!r}" for f in names))

    def collect_interpreter_setup(self, log: logging.Logger) -> InterpreterSetup:
        """The host's IPython configuration meant for the interpreter (issue 18 item 9:
        :class:`~.interpreter_config.InterpreterSetup`, from this kernel's configuration and
        its application's profile); empty with :attr:`forward_ipython_config` off.  What is
        left out is logged."""
        if not self.forward_ipython_config:
            return InterpreterSetup()
        profile_dir = getattr(self.parent, "profile_dir", None)
        setup = InterpreterSetup.collect(self.config, getattr(profile_dir, "location", None))
        setup.log_skipped(log)
        if not setup.empty:
            log.info("IPython configuration carried into the sandbox: %s", setup.describe())
        return setup

    def _old_spellings(self, cls: type[SandboxBackend], log: logging.Logger) -> dict[str, Any]:
        """Backend keyword arguments from the deprecated spellings, unless the new one is set."""
        new = self.config[cls.__name__] if cls.__name__ in self.config else {}
        old: dict[str, tuple[str, Any]] = {
            k: (f"SandboxKernel.backend_options[{k!r}]", v) for k, v in self.backend_options.items()}
        for name, target in DEPRECATED_ALIASES.items():
            value = getattr(self, name)
            if value is None or (name == "python" and value == ""):  # "" was the old default
                continue
            if target.split(".")[0] != cls.__name__:
                log.warning("--SandboxKernel.%s is deprecated and ignored: it was an option of the "
                            "local backend (%s)", name, target)
                continue
            old[name] = (f"SandboxKernel.{name}", value)
        kwargs = {}
        for name, (spelling, value) in old.items():
            if name in new:
                log.warning("--%s is deprecated and ignored: --%s.%s is set", spelling, cls.__name__, name)
                continue
            log.warning("--%s is deprecated: use --%s.%s (`sandbox-kernel install` writes it)",
                        spelling, cls.__name__, name)
            kwargs[name] = value
        return kwargs


def unknown_options(cls: type[SandboxBackend], config: Mapping[str, Any],
                    kwargs: Mapping[str, Any]) -> None:
    """Refuse options ``cls`` does not have, in its configuration section (and the
    base ``SandboxBackend``'s) or in ``kwargs``.

    Raises
    ------
    ConfigError
        Naming the first unknown option and the closest known ones.
    """
    known = set(cls.class_trait_names(config=True))
    given: list[tuple[str, str, Any]] = [(cls.__name__, k, v) for k, v in kwargs.items()]
    for section in ("SandboxBackend", cls.__name__):
        if section in config:
            given += [(section, k, v) for k, v in config[section].items()]
    for section, name, value in given:
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise ConfigError(f"{section}.{name}", _plain(value),
                              f"the {cls.name} backend has no such option; {hint}its options: "
                              f"{', '.join(sorted(known))}")


def trait_config_error(cls: type[SandboxBackend], err: TraitError, config: Mapping[str, Any],
                       kwargs: Mapping[str, Any]) -> ConfigError:
    """A :class:`ConfigError` for a trait value ``cls`` refused, naming the option."""
    section = config[cls.__name__] if cls.__name__ in config else {}
    for name in cls.class_trait_names(config=True):
        if f"'{name}' trait" in str(err) and (name in kwargs or name in section):
            value = kwargs[name] if name in kwargs else section[name]
            return ConfigError(f"{cls.__name__}.{name}", _plain(value), str(err))
    return ConfigError(cls.__name__, None, str(err))


def _plain(value: Any) -> Any:
    """A configuration value as given (traitlets defers command-line strings)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return list(value)
    return value


# ---- kernelspecs -------------------------------------------------------------------------------


def kernel_trait_names() -> list[str]:
    """``SandboxKernel`` options a kernelspec may set: the policy's and the kernel's own,
    without ``backend`` (given apart) and the deprecated spellings."""
    skip = {"backend", "backend_options", *DEPRECATED_ALIASES}
    return [n for n in KernelOptions.class_trait_names(config=True) if n not in skip]


def backend_class_name(backend: str) -> str:
    """The class name of backend entry point ``backend``, without importing it (its SDK
    may be missing where the kernelspec is written)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="sandbox_kernel.backends"):
        if ep.name == backend:
            return ep.value.rpartition(":")[2]
    raise ConfigError("backend", backend, "no installed backend has that name")


def backend_traits(backend: str) -> dict[str, TraitType] | None:
    """The configurable traits of backend ``backend``, or None if it cannot be imported here."""
    try:
        cls = load_backend(backend)
    except Exception:  # noqa: BLE001  (a missing SDK, a broken install: unknown, not fatal)
        return None
    return cls.class_traits(config=True)


def route_options(backend: str, options: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """Where each option of a kernelspec goes: ``(class, name, value)`` triples.

    A policy or kernel option goes to ``SandboxKernel``; any other name to the
    backend's class (checked against its traits when it can be imported);
    ``backend_options`` (the old spelling) is split into the backend's options.

    Raises
    ------
    ConfigError
        For a name that is neither.
    """
    kernel = set(kernel_trait_names())
    cls_name = backend_class_name(backend)
    known = backend_traits(backend)
    out: list[tuple[str, str, Any]] = []
    items = [(k, v) for k, v in options.items() if k != "backend_options"]
    items += list(dict(options.get("backend_options") or {}).items())
    for name, value in items:
        if name in kernel:
            out.append(("SandboxKernel", name, value))
        elif known is None or name in known:
            out.append((cls_name, name, value))
        else:
            raise ConfigError(name, value, f"neither a SandboxKernel option nor one of the {backend} "
                              f"backend's ({', '.join(sorted(known))})")
    return out


# ---- command-line flags ------------------------------------------------------------------------


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def add_trait_flags(parser: Any, traits: Mapping[str, TraitType]) -> None:
    """Add one ``--memory-mib``-style flag per trait, default unset (None).

    The flag's type follows the trait's: numbers, choices, a repeatable flag for
    a list (``--ro-paths /a --ro-paths /b``) or a dict (``--env NAME=VALUE``),
    ``--x/--no-x`` for a bool.  Its help is the trait's (unit and default included).
    A policy option's :attr:`~sandbox_kernel.policy.OptionMeta.alias` is a second
    spelling of its flag (``--allow-domain``).

    Parameters
    ----------
    parser : argparse.ArgumentParser or argument group
    traits : mapping of str to traitlets.TraitType
        Trait name (the flag's ``dest``) to trait.
    """
    from .policy import OPTIONS_BY_NAME

    for name, t in traits.items():
        flags = ["--" + name.replace("_", "-")]
        opt = OPTIONS_BY_NAME.get(name)
        if opt is not None and opt.meta.alias:
            flags.append(opt.meta.alias)
        kw: dict[str, Any] = {"dest": name, "default": None, "help": (t.help or "").replace("%", "%%")}
        if isinstance(t, Bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(t, Integer):
            kw.update(type=int, metavar="N")
        elif isinstance(t, Float):
            kw.update(type=float, metavar="X")
        elif isinstance(t, Enum):
            kw.update(type=str.lower if isinstance(t, CaselessStrEnum) else str,
                      choices=[str(v) for v in (t.values or ())])
        elif isinstance(t, List) and isinstance(t._trait, Integer):
            kw.update(action="append", type=int, metavar="N")
        elif isinstance(t, List):
            kw.update(action="append", metavar="VALUE")
        elif isinstance(t, Dict):
            kw.update(action="append", type=_pair, metavar="NAME=VALUE")
        else:
            kw.update(metavar="VALUE")
        parser.add_argument(*flags, **kw)


def flag_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The flags of ``names`` given on the command line, as option values (unset ones
    left out; ``NAME=VALUE`` pairs as a dict)."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(args, name, None)
        if value is None:
            continue
        if isinstance(value, list) and value and isinstance(value[0], tuple):
            value = dict(value)
        out[name] = value
    return out


def policy_traits() -> dict[str, TraitType]:
    """``SandboxKernel``'s policy traits by name, in :data:`~sandbox_kernel.policy.OPTIONS` order."""
    traits = PolicyTraits.class_traits(config=True)  # type: ignore[attr-defined]
    return {o.name: traits[o.name] for o in OPTIONS}
