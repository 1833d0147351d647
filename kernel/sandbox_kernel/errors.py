"""One error hierarchy for sandbox-kernel.

Each class also subclasses the builtin it resembles, so callers that catch
``RuntimeError`` or ``ValueError`` keep working, and every message says what to
do next.
"""

from __future__ import annotations


class SandboxKernelError(Exception):
    """Base class of every error raised by sandbox-kernel."""


class ConfigError(SandboxKernelError, ValueError):
    """A kernel or backend option has a bad value or an unknown name.

    The kernel does not crash on it: it starts, answers ``kernel_info``, and
    replies to every request with this message (``SandboxUnavailable``).

    Parameters
    ----------
    option : str
        The option as it is configured, e.g. ``"E2BBackend.deadman_s"``.
    value : object
        The rejected value.
    reason : str
        What is wrong and what would be accepted.
    """

    #: How the message names the option.
    what = "option"

    def __init__(self, option: str, value: object, reason: str):
        self.option = option
        self.value = value
        self.reason = reason
        super().__init__(f"{self.what} {option}={value!r}: {reason}")


class PolicyError(ConfigError):
    """A policy field has a bad value, or an override tried to loosen the operator's policy.

    Parameters
    ----------
    field : str
        Name of the offending :class:`~sandbox_kernel.policy.Policy` field.
    value : object
        The rejected value.
    reason : str
        What is wrong and what would be accepted.
    """

    what = "policy field"

    def __init__(self, field: str, value: object, reason: str):
        self.field = field
        super().__init__(field, value, reason)


class RuntimeUnavailable(SandboxKernelError, RuntimeError):
    """No usable sandbox runtime (gVisor ``runsc`` or bubblewrap) on this machine.

    The message names the missing program and the command that installs it;
    ``sandbox-kernel doctor`` gives the full picture.
    """


class BackendNotFound(SandboxKernelError, LookupError):
    """No backend of that name in the ``sandbox_kernel.backends`` entry-point group,
    or its optional extra (``pip install 'sandbox-kernel[e2b]'``) is not installed."""


class SandboxStartError(SandboxKernelError, RuntimeError):
    """The sandbox or the agent inside it did not start; the message carries its stderr tail."""


class KernelShuttingDown(SandboxStartError):
    """A request came after the kernel began to shut down (or restart): no sandbox is
    started, woken or kept for it.  The frontend restarts the kernel to go on."""

    #: The ``ename`` of the error reply the request gets.
    ename = "KernelShuttingDown"


class AdmissionRefused(SandboxStartError):
    """The machine cannot hold this sandbox: it was refused rather than overcommitted.

    The message names the resource and the numbers, and what would make room.

    Parameters
    ----------
    message : str
    resource : {"memory", "pids", "disk"}
    need : int
        What the sandbox would take (``unit``).
    available : int
        What the machine can still give under the operator's headroom (``unit``).
    unit : str
        ``"MiB"`` or ``"pids"``.
    **figures
        The numbers behind ``available`` (host total, headroom, committed...).

    Attributes
    ----------
    details : dict
        ``resource``, ``need``, ``available``, ``unit`` and the figures: what an
        agent reads in the error reply's ``admission`` field.
    """

    ename = "AdmissionRefused"

    def __init__(self, message: str, *, resource: str, need: int, available: int, unit: str,
                 **figures: object):
        self.details = {"resource": resource, "need": need, "available": available, "unit": unit, **figures}
        super().__init__(message)


class SandboxDied(SandboxKernelError, RuntimeError):
    """The sandbox (or the interpreter inside it) ended while a request was pending.

    Attributes
    ----------
    cause : str
        Human-readable cause: ``"memory limit 2048 MiB exceeded"``,
        ``"killed by signal SIGKILL"``, ``"exit code 1"``...
    """

    def __init__(self, cause: str):
        self.cause = cause
        super().__init__(cause)


class KernelRewound(SandboxDied):
    """The kernel was rewound to a snapshot (``restore_request``) while a request was
    pending: it was ended as an interrupt would end it, and its reply is this error."""

    ename = "KernelRewound"


class SnapshotError(SandboxKernelError):
    """A snapshot or a restore was refused or failed; the running kernel is untouched
    unless the message says otherwise.

    Parameters
    ----------
    message : str
        The cause in plain words (naming the runtime or backend that cannot, the
        unknown id...).
    ename : str
        What the reply's ``ename`` says: ``SnapshotUnsupported`` (this backend or
        runtime cannot), ``UnknownSnapshot`` (no snapshot of that id), ``RestoreInProgress``
        (another snapshot or restore runs), ``SnapshotRefused`` (no disk for the image, or the sandbox
        service's image bound),
        ``SnapshotFailed`` (the runtime failed).
    """

    def __init__(self, message: str, ename: str = "SnapshotFailed"):
        super().__init__(message)
        self.ename = ename


class NoReply(SandboxKernelError, RuntimeError):
    """The inner kernel went idle for a request without replying to it (an error inside
    ipykernel's handler); the request ends with this instead of waiting forever.
    The interpreter and its state are intact."""


class CredentialsMissing(SandboxKernelError, PermissionError):
    """A cloud backend has no credentials (``E2B_API_KEY``, Modal token)."""


class BackendError(SandboxKernelError, ConnectionError):
    """A cloud backend's SDK failed; raised ``from`` the SDK's own exception."""


class FileTransferError(SandboxKernelError, OSError):
    """A file transfer failed: the sandbox refused it, broke off, or answered inconsistently.

    Raised on the host by :mod:`sandbox_kernel.files` (the proxy) and by the file
    comm's clients (:mod:`sandbox_kernel.client.files`), which raise a builtin
    instead where the kernel's ``ename`` names one.

    Attributes
    ----------
    ename : str
        The error's name for the client: a builtin's (``FileNotFoundError``,
        ``PermissionError``...), ``FileTooLarge`` or ``FileTransferError``.
    """

    def __init__(self, message: str, ename: str = "FileTransferError"):
        super().__init__(message)
        self.ename = ename
