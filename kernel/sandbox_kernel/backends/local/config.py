"""The local backend's options: the traits of :class:`LocalBackendConfig`, which
:class:`.backend.LocalBackend` inherits, so they are set as ``--LocalBackend.<name>``
(traitlets reads a class's config section for its inherited traits too).

Apart from the backend's verbs because they are most of its lines: each option's help
is what ``sandbox-kernel install --help`` and ``doctor`` show a user.
"""

from __future__ import annotations

import sys
from typing import Any

from traitlets import Bool, CaselessStrEnum, Float, Int, TraitError, Unicode, default, validate

from ..base import SandboxBackend, ready_timeout_trait, seconds_trait
from .runsc import PLATFORMS
from .service.wire import SERVICE_SOCKET


class LocalBackendConfig(SandboxBackend):
    """The options of :class:`.backend.LocalBackend` (traits; see each one's help)."""

    #: Options that shape the sandbox itself: with the policy's sandbox fields, what a
    #: warm pool's sandboxes must match (``sandbox-kernel pool`` takes them as flags).
    SANDBOX_OPTIONS = ("runtime", "python", "runsc_path", "gvisor_platform")
    #: The headroom options of admission (:class:`.admission.Admission`'s fields, same names;
    #: ``sandbox-kernel service`` takes them as flags for the sandboxes it makes).
    ADMISSION_OPTIONS = ("memory_headroom_mib", "memory_overcommit", "pids_headroom", "disk_headroom_mib")

    runtime = CaselessStrEnum(
        ["auto", "gvisor", "bubblewrap"], "auto", config=True,
        help="Runtime: gvisor (runsc), bubblewrap, or auto (gVisor if it works here, else "
        "bubblewrap; the log says which is in force). Default: auto.")
    python = Unicode(config=True, help="Host path of the Python interpreter run inside the sandbox; "
                     "its environment (sys.prefix and sys.base_prefix) is mounted read-only at the "
                     "same paths, so packages installed beside it import inside. Default: the "
                     "interpreter running the proxy.")
    runsc_path = Unicode("", config=True, help="The runsc binary for the gVisor runtime; '' = "
                         "/usr/local/lib/sandbox-kernel/runsc where scripts/setup.sh installed a current "
                         "one, else runsc on PATH. Default: ''.")
    gvisor_platform = CaselessStrEnum(
        list(PLATFORMS), "auto", config=True,
        help="gVisor's platform: systrap (runsc 2023 and later; system calls about 30x cheaper than "
        "ptrace), ptrace, kvm (needs /dev/kvm), or auto (systrap where this runsc runs it here, else "
        "ptrace; the log and kernel_info name the one in force). Default: auto.")
    pool_socket = Unicode(None, allow_none=True, config=True, help="Unix socket of a warm pool "
                          "(`sandbox-kernel pool`) to take a pre-started sandbox from; cold start when "
                          "it is absent, empty or its sandboxes differ; '' = never. Default: "
                          "<state dir>/pool.sock (/run/sandbox-kernel/pool.sock as root).")
    service_socket = Unicode(
        SERVICE_SOCKET, config=True,
        help="Unix socket of the sandbox service (`sandbox-kernel service`, run by root) through which a "
        "proxy that is not root has its gVisor sandboxes made and driven: cgroup limits, pause, checkpoint "
        "and restore, as root's kernels have them. Not used as root, nor when nothing answers there "
        "(rootless gVisor, or bubblewrap); '' = never. Default: " + SERVICE_SOCKET + ".")
    # Admission control (.admission): what this machine keeps back from sandboxes.  Options
    # of the backend, not policy: they describe the machine, not what a sandbox may do.
    memory_headroom_mib = Int(
        1024, min=0, config=True,
        help="Host memory never committed to sandboxes (proxies, the OS, page cache), MiB. A new or "
        "restored sandbox is refused when the memory limits (memory_mib) of the running and frozen "
        "sandboxes on this machine, with its own, would exceed (host memory - this) x "
        "memory_overcommit. Default: 1024.")
    memory_overcommit = Float(
        1.0, min=0.0, config=True,
        help="How many times (host memory - memory_headroom_mib) the sandboxes' memory limits may add up "
        "to. 1 = never overcommit: a sandbox over its limit meets its own cgroup's OOM killer, never the "
        "host's; above 1, more kernels that use less than their limit fit, and a memory rush can make "
        "the host kill a neighbour; 0 = no memory check. Default: 1.0.")
    pids_headroom = Int(
        2048, min=0, config=True,
        help="Process ids kept free on the host: a sandbox is refused when fewer would be left. "
        "Default: 2048.")
    disk_headroom_mib = Int(
        1024, min=0, config=True,
        help="Disk kept free beside a checkpoint image under the state directory, MiB (a sandbox that "
        "may be checkpointed is refused when its image, up to memory_mib, would not fit). "
        "Default: 1024.")
    checkpoint_compression = CaselessStrEnum(
        ["auto", "none", "flate-best-speed"], "auto", config=True,
        help="Compression of gVisor checkpoint images (runsc checkpoint --compression): none restores "
        "faster (no inflating: a restore to the first reply about 0.3 s instead of 0.55 s here) and "
        "takes about the memory in use on disk; flate-best-speed takes about a quarter; auto = none, "
        "unless the state directory is on a tmpfs (Debian's /run), where the image is held in memory "
        "and compression keeps what a checkpoint frees. Default: auto.")
    restore_wait_s = seconds_trait(
        30.0, "How long waking a checkpointed kernel waits for memory when the machine is full, "
        "retrying every second (another kernel's is never killed to make room); then the cell is "
        "refused with the numbers and the state stays on disk.")
    start_template = Bool(
        True, config=True,
        help="gVisor, as root, network=none, no workspace folder: checkpoint the first kernel of a "
        "policy the moment its interpreter is ready (before any cell; it pauses about 0.1 s) and start "
        "a later kernel of that policy that finds no spare sandbox (spare_sandbox) by restoring that "
        "image into its own sandbox instead of starting an interpreter (the first kernel of a policy "
        "after a reboot: about 0.9 s to its first reply instead of 4.4 s; docs/lifecycle.md). Each "
        "restored interpreter's random generators are reseeded before its first cell. Templates are "
        "kept on disk, in /var/cache/sandbox-kernel/templates as root (about 100 MiB each, "
        "uncompressed; SANDBOX_KERNEL_TEMPLATE_DIR moves them; `sandbox-kernel gc --templates` "
        "removes them). Default: True.")
    start_templates_max = Int(
        4, min=1, config=True,
        help="With start_template: how many start templates (one per policy, interpreter and "
        "installed packages; about 100 MiB each on a disk, uncompressed) this user keeps; making one "
        "more removes the least recently used. Kernels already restored from a removed one are not "
        "affected. Where the template directory is a tmpfs, admission counts the templates as memory "
        "in use. "
        "Default: 4.")
    spare_sandbox = Bool(
        True, config=True,
        help="network=none, no workspace folder: a kernel of a "
        "policy seen before (within spare_linger_s), or one that has lived spare_after_s, starts a "
        "spare pool for its policy, a process of this user that keeps one sandbox of that policy "
        "started; the next kernel (or restart) takes it instead of starting cold, and the pool starts "
        "another. The pool ends spare_linger_s after the policy's last kernel, or after spare_idle_s "
        "unused; counted by admission (a kernel refused while spares are kept ends them and asks "
        "again); `sandbox-kernel doctor` lists them, `sandbox-kernel gc` ends them. Default: True.")
    spare_after_s = seconds_trait(
        20.0, "With spare_sandbox: the first kernel of a policy not seen before starts its spare pool "
        "once it has been ready this long (a one-off kernel costs no spare).")
    spare_linger_s = seconds_trait(
        60.0, "With spare_sandbox: a spare pool ends, and its sandbox with it, once no kernel of its "
        "policy has run for this long (a restart or the next notebook within it takes the spare).")
    spare_idle_s = seconds_trait(
        600.0, "A spare pool (spare_sandbox) whose sandbox nobody took for this long ends, and its sandbox "
        "with it.")
    spare_pools_max = Int(
        2, min=1, config=True,
        help="With spare_sandbox: how many spare pools (one per policy, runtime and interpreter, each "
        "holding one started sandbox) this user keeps; starting one more ends the least recently used. "
        "Default: 2.")
    fork_from = Unicode(
        "", config=True,
        help="Set by the client that forks a kernel (fork_request, docs/lifecycle.md), not by hand: a "
        "fork's hand-off directory under this user's snapshots, whose image this kernel's first sandbox "
        "is restored from (then reseeded); the directory is removed at that start. '' = start as usual. "
        "Default: ''.")
    #: Above the agent's own 120 s for the inner kernel (guest/agent/core.py READY_TIMEOUT_S), so that
    #: its clearer message comes first; a sandbox itself starts in 0.5 to 5 s.
    ready_timeout_s = ready_timeout_trait(150.0)

    @default("python")
    def _default_python(self) -> str:
        return sys.executable

    @validate("python")
    def _check_python(self, proposal: Any) -> str:
        if not str(proposal.value).startswith("/"):
            raise TraitError(f"The 'python' trait of a LocalBackend instance must be an absolute path, "
                             f"not {proposal.value!r}.")
        return str(proposal.value)
