"""The backend contract: one sandbox holding one agent, seen as a byte stream.

A backend is shaped like :class:`asyncio.subprocess.Process` (as
``jupyter_client``'s provisioners and Modal's sandboxes are): start it, write
frames to the agent's stdin, read frames from its stdout, and manage the
sandbox's lifecycle.  Everything read is untrusted; parsing happens in
:mod:`sandbox_kernel.protocol`, never here.

Backends are found through the ``sandbox_kernel.backends`` entry-point group
(:func:`sandbox_kernel.backends.load_backend`).  Like jupyter_client's kernel
provisioners (``provisioning/provisioner_base.py``, ``factory.py``), a backend is
a traitlets ``LoggingConfigurable`` that the kernel builds with ``parent=kernel``:
its options are traits, set in kernelspec argv (``--E2BBackend.template=...``)
or a config file (``c.E2BBackend.template = ...``), typed and documented with
their unit and default.
"""

from __future__ import annotations

import abc
import logging
import signal
from dataclasses import dataclass
from typing import Any, ClassVar

from traitlets import Float, default
from traitlets.config import LoggingConfigurable

from ..egress.record import EgressLog
from ..errors import SnapshotError
from ..policy import OPTIONS, Policy

#: Prefix of every sandbox's name, label or metadata key this package creates:
#: local state directories and container ids (``sandbox-kernel-<kernel id>-<suffix>``,
#: which ``sandbox-kernel gc`` looks for), E2B metadata, Modal tags.
TAG = "sandbox-kernel"

#: Policy fields reported as ``limits`` in ``kernel_info_reply["sandbox"]`` (agents read them).
DESCRIBED_LIMITS = ("memory_mib", "cpu_cores", "pids_max", "scratch_mib", "cell_timeout_s", "lifetime_s",
                    "max_output_bytes_per_cell")

#: glibc's malloc in the sandbox keeps large freed blocks for reuse.  With its defaults a
#: freed block above the mmap threshold (128 KiB, rising with use) goes back to the kernel
#: and the heap's top is trimmed, so the next large buffer faults its pages in again:
#: under gVisor each fault is a trip to the Sentry, elsewhere still a fault per page.  A
#: 1 MB image is ~1.4 MB of base64 copied several times through the inner kernel, libzmq
#: and the agent (docs/decisions.md, "What a write and a page fault cost under gVisor").
#: Blocks up to 32 MiB come from the heap and up to 64 MiB of freed heap is kept, inside
#: the sandbox's own memory limit; an operator's ``env`` may set other values.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}

#: Environment every backend gives the agent and the interpreter, whatever the
#: sandbox: UTF-8 I/O, no bytecode writes, matplotlib's cache in /tmp, :data:`MALLOC_ENV`.
#: Backends add their own paths (the local ``layout.sandbox_env``; E2B's ``agent_env``,
#: Modal's ``sandbox_env``).
INTERPRETER_ENV = {
    **MALLOC_ENV,
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    "MPLCONFIGDIR": "/tmp/.matplotlib",
    # No network inside: make pip fail at once instead of retrying for seconds.
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


#: Policy fields that only mean something with ``network="allowlist"``: not reported as
#: unenforced under ``network="none"``.
EGRESS_FIELDS = frozenset({"allow_domains", "allow_ports", "egress_resolve", "max_egress_connections_per_cell",
                           "max_egress_bytes_per_cell"})


@dataclass(frozen=True)
class Usage:
    """What a sandbox uses now, as its backend reads it.

    Attributes
    ----------
    memory_bytes : int
        Memory held by the sandbox's processes (its memory cgroup's usage), bytes.
    cpu_s : float
        CPU time its processes have used since it started, seconds.
    source : str
        Where the figures were read (e.g. ``"cgroup"``).
    memory_peak_bytes : int or None
        The most it held since :meth:`SandboxBackend.usage` was last asked with
        ``reset_peak`` (a cell's start), bytes; None where not measured.
    """

    memory_bytes: int
    cpu_s: float
    source: str
    memory_peak_bytes: int | None = None


def interpreter_env(policy: Policy) -> dict[str, str]:
    """:data:`INTERPRETER_ENV` for ``policy``: with egress, pip may use an index
    (``PIP_NO_INDEX`` is left out) and ``SANDBOX_KERNEL_EGRESS`` names the network
    mode, so the agent leaves ``%pip`` alone (no "this sandbox has no network")."""
    env = dict(INTERPRETER_ENV)
    if policy.network != "none":
        env.pop("PIP_NO_INDEX")
        env["SANDBOX_KERNEL_EGRESS"] = policy.network
    return env


@dataclass(frozen=True)
class Capabilities:
    """What a backend's sandbox can do, declared instead of half-implemented.

    Attributes
    ----------
    boundary : str
        The isolation boundary in one phrase, e.g. ``"gVisor user-space kernel
        (ptrace platform)"`` or ``"Firecracker microVM"``; shown by ``doctor``
        and logged at start.
    pause_keeps_memory : bool
        :meth:`SandboxBackend.pause` keeps the interpreter's memory (state survives).
    checkpoint : bool
        :meth:`SandboxBackend.checkpoint` frees memory by writing it to disk.
    """

    boundary: str
    pause_keeps_memory: bool = False
    checkpoint: bool = False


@dataclass(frozen=True)
class ExitInfo:
    """How a sandbox ended.

    Attributes
    ----------
    cause : str
        Plain words, naming the limit where one was hit: ``"memory limit 2048 MiB
        exceeded"``, ``"exit code 1"``.
    returncode : int or None
        Exit status of the sandbox process where there is one.
    """

    cause: str
    returncode: int | None = None


def signal_suffix(num: int) -> str:
    """`` (SIGKILL)`` for 9, to follow a signal's number in a cause; "" for a number that
    is no signal."""
    try:
        return f" ({signal.Signals(num).name})"
    except ValueError:
        return ""


def seconds_trait(default_s: float, help: str) -> Float:
    """A configurable duration in seconds (>= 0), its unit and default stated in its help."""
    return Float(default_s, min=0.0, config=True, help=f"{help} Unit: s. Default: {default_s:g}.")


def ready_timeout_trait(default_s: float) -> Float:
    """The ``ready_timeout_s`` trait with a backend's own default (seconds)."""
    return seconds_trait(default_s, "How long the relay waits for the agent's ready frame after "
                         "the sandbox started or its interpreter restarted, before it gives up with "
                         "SandboxStartError.")


class _BackendMeta(abc.ABCMeta, type(LoggingConfigurable)):  # type: ignore[misc]
    """``ABCMeta`` merged with traitlets' metaclass, as jupyter_client's
    ``KernelProvisionerMeta`` does, so a backend is both abstract and configurable."""


class SandboxBackend(abc.ABC, LoggingConfigurable, metaclass=_BackendMeta):  # type: ignore[metaclass]
    """One sandbox running the agent (the ``guest/agent`` zipapp) with framed stdio.

    Parameters
    ----------
    policy : Policy
        Limits, mounts, network and idle times; already validated.
    kernel_id : str
        Tag put on the sandbox (name, label or metadata), so an orphan can be
        told apart: ``sandbox-kernel gc`` finds local ones by it, cloud ones
        are found in the provider's listing and end at their server-side
        lifetime.
    log : logging.Logger, optional
        Default: the ``sandbox_kernel.backends.<name>`` logger.
    **kwargs
        ``parent`` (the kernel, whose configuration applies), ``config``, or
        trait values, which win over the configuration.

    Raises
    ------
    traitlets.TraitError
        If a trait value has the wrong type.  The kernel turns this, and any
        :class:`~sandbox_kernel.errors.ConfigError`, into an error reply
        naming the option.

    Notes
    -----
    All methods are called from the proxy's main asyncio loop, one at a time,
    except :meth:`read`, which the proxy's reader task awaits continuously.
    """

    #: Entry-point name (``--SandboxKernel.backend=...``).
    name: ClassVar[str]
    #: What the sandbox is, in a few words, for a kernelspec's display name
    #: (``Python 3 (sandbox: <display_name>)``) and ``doctor``.
    display_name: ClassVar[str] = ""
    #: The policy fields of scope ``"sandbox"`` (:data:`~sandbox_kernel.policy.Scope`)
    #: this backend enforces; the others are reported by :meth:`check_policy`.
    #: Fields of scope ``"proxy"`` are enforced by the proxy on every backend.
    enforced_fields: ClassVar[frozenset[str]] = frozenset()
    #: The backend mounts the workspace itself (``Policy.workspace``); otherwise the proxy
    #: copies it in through the agent (:mod:`sandbox_kernel.workspace_copy`).
    workspace_mount: ClassVar[bool] = False
    #: Where the backend's credentials come from, for ``doctor``; None: it needs none.
    credentials_hint: ClassVar[str | None] = None
    #: Why this backend does not snapshot, restore or fork a kernel, ending the default
    #: :meth:`snapshot_refusal` and :meth:`fork_refusal` (a backend that does overrides those).
    copies_unsupported: ClassVar[str] = "it does not implement them: local gVisor, Ray and E2B do"

    ready_timeout_s = ready_timeout_trait(180.0)
    refresh_every_s = seconds_trait(30.0, "How often the idle lifecycle calls refresh(), which "
                                    "extends a cloud sandbox's server-side lifetime.")

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None, **kwargs: Any):
        if log is not None:
            kwargs["log"] = log
        super().__init__(**kwargs)
        self.policy = policy
        self.kernel_id = kernel_id
        #: A line for the user about the last verb (a restore that had to wait for
        #: memory); the relay shows it with the wake's notice and clears it.
        self.notice: str | None = None
        #: What a verb under way is waiting for, in words, while it waits (a restore
        #: waiting for memory); the kernel shows it live in the cell that waits.
        self.waiting_for: str | None = None
        #: Egress attempts (``network=allowlist``); the kernel observes it
        #: (:meth:`~sandbox_kernel.egress.record.EgressLog.observe`) to show denials.
        self.egress_log = EgressLog()

    #: What this backend's egress allowlist enforces, in one sentence, for ``doctor``,
    #: ``kernel_info`` and ``docs/security.md``; empty: it cannot enforce ``allowlist``.
    egress_enforcement: ClassVar[str] = ""

    @default("log")
    def _default_log(self) -> logging.Logger:
        return logging.getLogger(f"sandbox_kernel.backends.{self.name}")

    @classmethod
    def check_policy(cls, policy: Policy) -> list[str]:
        """The fields of ``policy`` this backend would not enforce.

        Called by the kernel at start (it logs a warning naming them) and by
        ``sandbox-kernel doctor``.  Lists the fields of scope ``"sandbox"`` not
        in :attr:`enforced_fields`, except empty lists (nothing to enforce) and,
        under ``network="none"``, the egress options (:data:`EGRESS_FIELDS`).

        Returns
        -------
        list of str
            Field names, in :data:`~sandbox_kernel.policy.OPTIONS` order.
        """
        return [o.name for o in OPTIONS if o.scope == "sandbox" and o.name not in cls.enforced_fields
                and getattr(policy, o.name) != ()
                and not (policy.network == "none" and o.name in EGRESS_FIELDS)]

    async def doctor(self) -> list[str]:
        """What stops this backend from working here, each with its next step.

        Called by ``sandbox-kernel doctor`` on a backend built with the default
        policy and option defaults; starts no sandbox.  Default: nothing to check.

        Returns
        -------
        list of str
            Problems; empty when the backend looks usable.
        """
        return []

    async def host_report(self) -> dict[str, Any] | None:
        """Whether this machine can host this backend's sandboxes, for backends whose
        sandboxes run on machines the operator prepares (a Ray cluster's nodes); None
        for the others (their sandboxes run here through the local backend, or in a cloud).

        Called by ``sandbox-kernel doctor`` on a backend built as for :meth:`doctor`; starts
        no sandbox (it may run the runtime's own quick probe).

        Returns
        -------
        dict or None
            ``can_host`` (bool), ``facts`` (list of str: what was found), ``problems``
            (list of str: what stops it, each with its next step), ``notes`` (list of str).
        """
        return None

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend's sandboxes can do (may depend on the runtime chosen)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the sandbox and start the agent in it.

        Called by the proxy at kernel start and after the sandbox died or was
        stopped, before any :meth:`write`.

        Raises
        ------
        SandboxStartError
            With the runtime's stderr tail, when the sandbox does not come up.
        """

    @property
    def holds_ready(self) -> bool:
        """The relay must await :meth:`on_ready` before the sandbox takes requests."""
        return False

    async def on_ready(self) -> None:
        """Called by the relay when a freshly started sandbox's agent reported ``ready``
        and :attr:`holds_ready`, before any request is sent to it (the local backend
        makes a start template then). Errors it raises are logged, the start goes on."""

    @abc.abstractmethod
    async def read(self) -> bytes:
        """Return the next chunk of the agent's stdout (any size, any split).

        Returns ``b""`` once the stream has ended: the agent exited, the
        sandbox died, or (on cloud backends) the stream was detached by a
        pause.  Called in a loop by the proxy's reader task.
        """

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes (whole frames) to the agent's stdin.

        Raises
        ------
        SandboxDied
            If the sandbox is gone.
        """

    async def pause(self) -> None:
        """Suspend the sandbox; called by the idle lifecycle when
        ``pause_after_s`` passed without a request.  Only called when
        :attr:`Capabilities.pause_keeps_memory` is true."""
        raise NotImplementedError(f"{self.name} cannot pause")

    async def resume(self) -> None:
        """Undo :meth:`pause` or :meth:`checkpoint`; called before the next
        request is relayed.  After it, :meth:`read` yields the reattached stream."""
        raise NotImplementedError(f"{self.name} cannot resume")

    async def checkpoint(self) -> None:
        """Write the paused sandbox's memory to disk and free it; called after
        ``checkpoint_after_s``.  Only when :attr:`Capabilities.checkpoint`."""
        raise NotImplementedError(f"{self.name} cannot checkpoint")

    def snapshot_refusal(self) -> str | None:
        """Why this backend cannot snapshot and rewind a kernel (``snapshot_request``,
        ``restore_request``: :mod:`sandbox_kernel.snapshots`), in plain words naming it;
        None when it can.  Asked before anything is touched."""
        return (f"the {self.display_name or self.name} backend cannot snapshot or restore a kernel yet "
                f"({self.copies_unsupported})")

    async def snapshot(self, snapshot_id: str) -> int:
        """Keep the running sandbox's whole state (memory, files, processes) under
        ``snapshot_id``; the sandbox goes on.

        Returns
        -------
        int
            Bytes the snapshot takes on disk.

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported`` (:meth:`snapshot_refusal`), or the runtime failed
            (``SnapshotFailed``; nothing kept, the sandbox goes on).
        """
        raise SnapshotError(self.snapshot_refusal() or f"{self.name} cannot snapshot", "SnapshotUnsupported")

    async def restore_snapshot(self, snapshot_id: str, *, interrupt: bool = False) -> None:
        """Replace the sandbox (killed first) with one restored from ``snapshot_id``, made
        its own (the interpreter's entropy redrawn, :mod:`.guest.agent.interpreter.clone`);
        :meth:`read` yields its stream from then on.  With ``interrupt`` (a cell ran when
        the snapshot was taken), that cell is interrupted first, so the interpreter is idle
        for the reseed's completer warm-up and the requests to come.

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported``, or ``UnknownSnapshot`` (nothing touched), or the
            restore failed (the sandbox is gone).
        """
        raise SnapshotError(self.snapshot_refusal() or f"{self.name} cannot restore", "SnapshotUnsupported")

    def fork_refusal(self) -> str | None:
        """Why this backend cannot fork a kernel (``fork_request``: :mod:`sandbox_kernel.snapshots`),
        in plain words naming it; None when it can.  Asked before anything is touched."""
        return (f"fork of a kernel on the {self.display_name or self.name} backend is not supported yet "
                f"({self.copies_unsupported})")

    def copy_operations(self) -> dict[str, str | None]:
        """Which of snapshot, restore (rewind in place) and fork this backend does: each
        operation's refusal in plain words (:meth:`snapshot_refusal`, :meth:`fork_refusal`),
        None where it does it.  Read by :meth:`describe` (``kernel_info``) and by
        ``sandbox-kernel doctor``; never touches a sandbox.

        Returns
        -------
        dict
            ``{"snapshot": str or None, "restore": str or None, "fork": str or None}``.
        """
        refusal = self.snapshot_refusal()
        return {"snapshot": refusal, "restore": refusal, "fork": self.fork_refusal()}

    def admit_forks(self, n: int) -> None:
        """Refuse ``n`` forks the machine (or account) cannot hold now, before anything is
        written.  Called by the proxy after :meth:`fork_refusal` said None.

        Raises
        ------
        SnapshotError
            ``ForkRefused``, naming the resource.
        """

    async def fork(self, fork_id: str, n: int, meta: dict[str, Any]) -> tuple[list[str], int]:
        """Snapshot the running sandbox (it goes on) for ``n`` new kernels to start from.

        Called by the proxy (``fork_request``) on its main loop, the sandbox awake.

        Parameters
        ----------
        fork_id : str
        n : int
            How many forks, already checked against the kernel's bound.
        meta : dict
            What each fork's proxy needs besides the image (the source's ``kernel_info``,
            whether a cell ran...), JSON.

        Returns
        -------
        tuple of (list of str, int)
            One hand-off per fork (what the fork's backend option ``fork_from`` is set to),
            and the bytes the image takes on disk.

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported`` (:meth:`fork_refusal`), or the runtime failed (nothing
            kept, the sandbox goes on).
        """
        raise SnapshotError(self.fork_refusal() or f"{self.name} cannot fork", "SnapshotUnsupported")

    def fork_argument(self, handoff: str) -> str:
        """The kernel argument that starts a fork's proxy from ``handoff`` (one of :meth:`fork`'s),
        ``--<backend class>.fork_from=<hand-off>``, for a backend with a ``fork_from`` trait.
        Called by the proxy for each fork of a ``fork_request``; the client appends it to the
        source's kernelspec argv."""
        return f"--{type(self).__name__}.fork_from={handoff}"

    def restored_copy(self) -> dict[str, Any] | None:
        """Called by the relay right after :meth:`start`: None for a sandbox that starts as
        usual (its agent reports ``ready``); for one restored from another kernel's running
        sandbox (a fork's first start), a dict, once: ``kernel_info`` (the source's interpreter's),
        ``busy`` (a cell of the source ran: interrupted in the copy, to end before the first
        request), ``source_kernel``, ``fork_id``, ``created``.  No ``ready`` comes from it: its agent
        numbers on from the source's."""
        return None

    def remove_snapshots(self, snapshot_ids: list[str] | None = None) -> None:
        """Remove these snapshots of this kernel (None: all of them, at shutdown); nothing
        for one already gone."""

    async def refresh(self) -> None:
        """Extend the server-side lifetime (dead-man's switch); called
        periodically by the proxy while it lives.  No-op by default."""

    async def reconnect(self) -> bool:
        """After :meth:`read` returned ``b""`` unexpectedly: get the stream back if the
        sandbox still lives behind a broken connection (E2B: its client does not resume a
        cut stream).  True: :meth:`read` yields the new stream, and the caller asks the
        agent to replay what the cut lost (``replay``); False (the default): the sandbox
        ended, and :meth:`exit_info` says why."""
        return False

    @abc.abstractmethod
    async def kill(self) -> None:
        """Destroy the sandbox and everything it holds (processes, mounts,
        directories).  Idempotent; called at shutdown, restart and stop."""

    @abc.abstractmethod
    async def exit_info(self) -> ExitInfo:
        """Explain why the stream ended; called by the proxy after :meth:`read`
        returned ``b""`` unexpectedly.  Waits briefly for the sandbox to end."""

    def usage(self, reset_peak: bool = False) -> Usage | None:
        """What the sandbox uses now (``usage_request`` and each cell's ``execute_reply``,
        :mod:`sandbox_kernel.usage`), or None: no sandbox running, or this backend cannot
        read it (then only the limits are given, never the host's figures).
        ``reset_peak``: the memory peak starts again from now (a cell starts)."""
        return None

    def explain_interpreter_death(self, cause: str) -> str:
        """Enrich the agent's report of an interpreter death (``"killed by signal
        SIGKILL"``) with what the backend knows, e.g. ``"memory limit 4096 MiB
        exceeded"``.  Called by the relay when the agent sends ``died``."""
        return cause

    def describe(self) -> dict:
        """State for ``kernel_info`` and logs: backend, boundary, ids, the policy's
        limits (:data:`DESCRIBED_LIMITS`, units in the names), ``egress`` (:meth:`describe_egress`),
        ``snapshots`` (``snapshot``, ``restore``, ``fork``: booleans, :meth:`copy_operations`;
        ``supported``: snapshot and restore both, and ``why_not``; ``fork_why_not``),
        and the policy fields not enforced (``unenforced``) if any."""
        p = self.policy
        ops = self.copy_operations()
        refusal, fork_refusal = ops["snapshot"] or ops["restore"], ops["fork"]
        snaps = {"snapshot": ops["snapshot"] is None, "restore": ops["restore"] is None,
                 "supported": refusal is None, **({"why_not": refusal} if refusal else {}),
                 "fork": fork_refusal is None, **({"fork_why_not": fork_refusal} if fork_refusal else {})}
        d: dict[str, Any] = {"backend": self.name, "boundary": self.capabilities.boundary,
                             "limits": {k: getattr(p, k) for k in DESCRIBED_LIMITS},
                             "egress": self.describe_egress(), "snapshots": snaps}
        unenforced = self.check_policy(self.policy)
        if unenforced:
            d["unenforced"] = unenforced
        return d

    def describe_egress(self) -> dict[str, Any]:
        """``kernel_info["sandbox"]["egress"]``: ``network`` (``"none"`` or
        ``"allowlist"``); with an allowlist also ``allow_domains``, ``allow_ports``,
        ``enforced`` (:attr:`egress_enforcement`), ``counts`` and ``recent``
        attempts (time, cell ``msg_id``, host, port, bytes, verdict; newest last)."""
        p = self.policy
        if p.network == "none":
            return {"network": "none"}
        return {"network": p.network, "allow_domains": list(p.allow_domains),
                "allow_ports": list(p.allow_ports), "enforced": self.egress_enforcement,
                **self.egress_log.describe()}
