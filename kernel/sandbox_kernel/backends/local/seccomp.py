"""A seccomp-BPF deny-list for the bubblewrap runtime, assembled without libseccomp.

bubblewrap loads the program from a file descriptor (``--seccomp FD``).  The
filter checks the architecture (x86_64 or aarch64; other architectures get
``SECCOMP_RET_KILL_PROCESS``), then returns ``EPERM`` for syscalls a Python
kernel never needs and that widen the shared-kernel attack surface: mounts,
ptrace, keyrings, BPF, module loading, kexec, namespaces, perf, userfaultfd.

Reference: ``Documentation/userspace-api/seccomp_filter.rst`` in Linux, and
``struct sock_filter`` in ``linux/filter.h``.
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes (linux/bpf_common.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_RET_K = 0x06

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# offsetof(struct seccomp_data, nr / arch)
_OFF_NR = 0
_OFF_ARCH = 4

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

#: Denied syscalls by name, with their numbers per architecture.
DENIED_SYSCALLS: dict[str, dict[str, int]] = {
    "mount": {"x86_64": 165, "aarch64": 40},
    "umount2": {"x86_64": 166, "aarch64": 39},
    "pivot_root": {"x86_64": 155, "aarch64": 41},
    "ptrace": {"x86_64": 101, "aarch64": 117},
    "process_vm_readv": {"x86_64": 310, "aarch64": 270},
    "process_vm_writev": {"x86_64": 311, "aarch64": 271},
    "keyctl": {"x86_64": 250, "aarch64": 219},
    "add_key": {"x86_64": 248, "aarch64": 217},
    "request_key": {"x86_64": 249, "aarch64": 218},
    "bpf": {"x86_64": 321, "aarch64": 280},
    "init_module": {"x86_64": 175, "aarch64": 105},
    "finit_module": {"x86_64": 313, "aarch64": 273},
    "delete_module": {"x86_64": 176, "aarch64": 106},
    "kexec_load": {"x86_64": 246, "aarch64": 104},
    "kexec_file_load": {"x86_64": 320, "aarch64": 294},
    "reboot": {"x86_64": 169, "aarch64": 142},
    "swapon": {"x86_64": 167, "aarch64": 224},
    "swapoff": {"x86_64": 168, "aarch64": 225},
    "setns": {"x86_64": 308, "aarch64": 268},
    "unshare": {"x86_64": 272, "aarch64": 97},
    "perf_event_open": {"x86_64": 298, "aarch64": 241},
    "userfaultfd": {"x86_64": 323, "aarch64": 282},
    "open_by_handle_at": {"x86_64": 304, "aarch64": 265},
    "name_to_handle_at": {"x86_64": 303, "aarch64": 264},
    "acct": {"x86_64": 163, "aarch64": 89},
    "quotactl": {"x86_64": 179, "aarch64": 60},
    "syslog": {"x86_64": 103, "aarch64": 116},
    "settimeofday": {"x86_64": 164, "aarch64": 170},
    "clock_settime": {"x86_64": 227, "aarch64": 112},
    "adjtimex": {"x86_64": 159, "aarch64": 171},
    "iopl": {"x86_64": 172},
    "ioperm": {"x86_64": 173},
    "vhangup": {"x86_64": 153, "aarch64": 58},
    "lookup_dcookie": {"x86_64": 212, "aarch64": 18},
    "fsopen": {"x86_64": 430, "aarch64": 430},
    "fsmount": {"x86_64": 432, "aarch64": 432},
    "move_mount": {"x86_64": 429, "aarch64": 429},
    "open_tree": {"x86_64": 428, "aarch64": 428},
}


#: System calls that may set a set-user-id or set-group-id bit, and which argument holds
#: the mode (:func:`build_filter` with ``no_setid``; :func:`oci_setid_profile`): with a
#: read-write workspace a cell's file lands on the host as the kernel's user's, and a
#: set-id bit on it would let any host user run it as that user (root, when the kernel
#: runs as root).
SETID_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "chmod": (1, {"x86_64": 90}),
    "fchmod": (1, {"x86_64": 91, "aarch64": 52}),
    "fchmodat": (2, {"x86_64": 268, "aarch64": 53}),
    "fchmodat2": (2, {"x86_64": 452, "aarch64": 452}),
    "open": (2, {"x86_64": 2}),
    "openat": (3, {"x86_64": 257, "aarch64": 56}),
    "creat": (1, {"x86_64": 85}),
    "mknod": (1, {"x86_64": 133}),
    "mknodat": (2, {"x86_64": 259, "aarch64": 33}),
}
#: Calls whose mode a filter cannot read (``openat2``'s lies in a struct; ``io_uring``
#: opens files in the kernel): ``ENOSYS`` with ``no_setid``, so callers fall back.
SETID_UNCHECKABLE: dict[str, dict[str, int]] = {
    "openat2": {"x86_64": 437, "aarch64": 437},
    "io_uring_setup": {"x86_64": 425, "aarch64": 425},
}
#: ``S_ISUID | S_ISGID``.
SETID_BITS = 0o6000
_JSET_K = 0x45
_OFF_ARGS = 16


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(arch: str | None = None, *, no_setid: bool = False) -> bytes:
    """Assemble the deny-list filter.

    Parameters
    ----------
    arch : {"x86_64", "aarch64"}, optional
        Defaults to this machine's.
    no_setid : bool
        Also refuse (``EPERM``) any mode with a set-id bit in :data:`SETID_SYSCALLS`,
        and ``ENOSYS`` for :data:`SETID_UNCHECKABLE` (a read-write workspace).

    Returns
    -------
    bytes
        A ``struct sock_filter`` array, as bubblewrap's ``--seccomp`` reads it.

    Raises
    ------
    ValueError
        On an architecture with no syscall table here.
    """
    arch = arch or platform.machine()
    if arch not in AUDIT_ARCH:
        raise ValueError(f"no seccomp syscall table for {arch!r}; use the gVisor runtime")
    numbers = sorted({n[arch] for n in DENIED_SYSCALLS.values() if arch in n})
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        _insn(_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    # x86_64: x32 syscalls have bit 30 set; they are not in our table, deny them all.
    if arch == "x86_64":
        prog.append(_insn(0x35, 0, 1, 0x40000000))  # JGE K: nr >= x32 bit -> deny
        prog.append(_insn(_RET_K, 0, 0, deny))
    if no_setid:
        prog += _setid_checks(arch, deny)
    n = len(numbers)
    for i, nr in enumerate(numbers):
        # if equal, jump to the deny return placed after the remaining checks
        prog.append(_insn(_JEQ_K, n - i, 0, nr))
    prog.append(_insn(_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, deny))
    return b"".join(prog)


def _setid_checks(arch: str, deny: int) -> list[bytes]:
    """Instructions refusing set-id modes; ``A`` holds the syscall's number before and
    after (for the calls they do not decide)."""
    out = []
    for index, numbers in SETID_SYSCALLS.values():
        if arch not in numbers:
            continue
        out += [
            _insn(_JEQ_K, 0, 4, numbers[arch]),
            _insn(_LD_W_ABS, 0, 0, _OFF_ARGS + 8 * index),  # the low 32 bits (little-endian)
            _insn(_JSET_K, 0, 1, SETID_BITS),
            _insn(_RET_K, 0, 0, deny),
            _insn(_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        ]
    for numbers in SETID_UNCHECKABLE.values():
        if arch in numbers:
            out += [_insn(_JEQ_K, 0, 1, numbers[arch]),
                    _insn(_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)]
    return out


def oci_setid_profile() -> dict:
    """The OCI ``linux.seccomp`` object refusing set-id modes inside gVisor (``runsc
    --oci-seccomp``: the sentry enforces it on every guest process), as
    :func:`build_filter` with ``no_setid`` does for bubblewrap."""
    rules: list[dict] = []
    for name, (index, _) in SETID_SYSCALLS.items():
        for bit in (0o4000, 0o2000):
            rules.append({"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM,
                          "args": [{"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}]})
    rules.append({"names": sorted(SETID_UNCHECKABLE), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
            "syscalls": rules}
