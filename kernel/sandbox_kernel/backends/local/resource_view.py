"""What a local sandbox is told about its CPUs and memory (case C15).

Libraries size thread pools and caches from ``os.cpu_count()``,
``os.sched_getaffinity(0)`` and ``/proc/meminfo``; inside a sandbox those must
show the sandbox's limits, not the host's.

* **CPUs, both runtimes**: a sandbox runs on :func:`sandbox_cpus` host CPUs,
  ``ceil(cpu_cores)`` of the proxy's own, starting at an offset taken from
  the sandbox's name, so many one-core kernels spread over the host instead of
  all landing on CPU 0 (``docs/decisions.md``).  gVisor gets them as the
  spec's ``linux.resources.cpu.cpus``: runsc puts the sandbox in a cpuset of
  those CPUs and the sentry reports that many CPUs (``os.cpu_count()``,
  affinity, its ``/sys`` and ``/proc/cpuinfo``).  bubblewrap's process gets
  them as its CPU affinity (:func:`sandbox_kernel.backends.local.bwrap.preexec_affinity`),
  and glibc's count comes from a generated ``/sys/devices/system/cpu/online``.
* **Memory, bubblewrap**: a generated ``/proc/meminfo`` (:func:`meminfo_text`)
  with ``MemTotal`` = ``memory_mib``.  It is a snapshot taken at launch: its
  ``MemFree``/``MemAvailable`` do not fall as the sandbox allocates.  gVisor's
  sentry makes its own, live, from the cgroup's limit.

:func:`write_resource_view` writes the generated files; the argv that binds
them is :func:`sandbox_kernel.backends.local.bwrap.bwrap_argv`'s.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...policy import Policy

#: ``/proc/meminfo`` fields written, in the kernel's order (those gVisor's sentry
#: writes, plus the slab lines psutil reads).  Only the first three are non-zero.
MEMINFO_FIELDS = (
    "MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SwapCached", "Active", "Inactive",
    "Active(anon)", "Inactive(anon)", "Active(file)", "Inactive(file)", "Unevictable", "Mlocked",
    "SwapTotal", "SwapFree", "Dirty", "Writeback", "AnonPages", "Mapped", "Shmem", "Slab",
    "SReclaimable", "SUnreclaim",
)
#: Files of a resource view, by sandbox path; the host file has the same base name.
VIEW_FILES = {
    "/proc/meminfo": "meminfo",
    "/proc/cpuinfo": "cpuinfo",
    "/sys/devices/system/cpu/online": "cpu-online",
    "/sys/devices/system/cpu/possible": "cpu-online",
    "/sys/devices/system/cpu/present": "cpu-online",
}


def sandbox_cpus(policy: Policy, key: str, available: Iterable[int] | None = None) -> tuple[int, ...]:
    """The host CPUs a sandbox runs on.

    Parameters
    ----------
    policy : Policy
        :attr:`Policy.cpu_cores`, rounded up, is how many (at most all of ``available``).
    key : str
        The sandbox's name (its container id: kernel id and a random suffix);
        its hash chooses where the run of consecutive CPUs starts, so sandboxes
        spread evenly over the host without shared state.
    available : iterable of int, optional
        CPUs to choose from; the proxy's own affinity by default.

    Returns
    -------
    tuple of int
        Sorted CPU numbers.
    """
    avail = sorted(os.sched_getaffinity(0) if available is None else set(available))
    n = min(len(avail), max(1, math.ceil(policy.cpu_cores)))
    start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % len(avail)
    return tuple(sorted(avail[(start + i) % len(avail)] for i in range(n)))


def cpu_list(cpus: Iterable[int]) -> str:
    """CPUs in the kernel's list format (``/sys/devices/system/cpu/online``, cpusets).

    Examples
    --------
    >>> cpu_list([0, 1, 2, 5])
    '0-2,5'
    """
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _kib(meminfo: str, field: str) -> int | None:
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name == field and rest.split():
            return int(rest.split()[0])
    return None


def meminfo_text(memory_mib: int, host_meminfo: str) -> str:
    """The sandbox's ``/proc/meminfo``: its memory limit as ``MemTotal``.

    Parameters
    ----------
    memory_mib : int
        The sandbox's memory limit, MiB.
    host_meminfo : str
        The host's ``/proc/meminfo`` at launch.

    Returns
    -------
    str
        ``MemTotal`` = the limit (or the host's total if smaller);
        ``MemFree`` = ``MemAvailable`` = the smaller of that and the host's
        ``MemAvailable`` (the sandbox uses nothing yet); no swap (the cgroup
        allows none); every other field 0.  Values in kB (KiB), as the kernel
        writes them.  A snapshot: it does not change while the sandbox runs.
    """
    total = memory_mib * 1024
    host_total = _kib(host_meminfo, "MemTotal")
    if host_total:
        total = min(total, host_total)
    avail = _kib(host_meminfo, "MemAvailable")
    free = total if avail is None else min(total, avail)
    values = {"MemTotal": total, "MemFree": free, "MemAvailable": free}
    return "".join(f"{name + ':':<16}{values.get(name, 0):>8} kB\n" for name in MEMINFO_FIELDS)


def cpuinfo_text(cpus: Iterable[int], host_cpuinfo: str) -> str:
    """The host's ``/proc/cpuinfo`` reduced to the entries of ``cpus``.

    ``siblings`` and ``cpu cores`` are rewritten to the sandbox's count, so
    that tools deriving core counts from them agree with ``os.cpu_count()``.
    """
    keep = set(cpus)
    blocks = [b for b in host_cpuinfo.strip("\n").split("\n\n") if b.strip()]
    out = []
    for block in blocks:
        fields = [line.partition(":") for line in block.splitlines()]
        proc = next((v.strip() for k, _, v in fields if k.strip() == "processor"), None)
        if proc is None or not proc.isdigit() or int(proc) not in keep:
            continue
        lines = []
        for k, sep, v in fields:
            if k.strip() in ("siblings", "cpu cores"):
                v = f" {len(keep)}"
            lines.append(f"{k}{sep}{v}")
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n\n"


@dataclass(frozen=True)
class ResourceView:
    """A sandbox's generated view of its CPUs and memory (bubblewrap binds it).

    Attributes
    ----------
    cpus : tuple of int
        Host CPUs the sandbox runs on (:func:`sandbox_cpus`).
    dir : str
        Host directory holding the files of :data:`VIEW_FILES`, readable by
        the sandbox user (0755, files 0644).
    """

    cpus: tuple[int, ...]
    dir: str


def write_resource_view(dest: Path, policy: Policy, cpus: tuple[int, ...]) -> ResourceView:
    """Write ``meminfo``, ``cpuinfo`` and ``cpu-online`` into ``dest`` from the host's
    files now (a snapshot; see :func:`meminfo_text`)."""
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(dest, 0o755)  # noqa: S103 - generated files the sandbox reads
    files = {
        "meminfo": meminfo_text(policy.memory_mib, Path("/proc/meminfo").read_text()),
        "cpuinfo": cpuinfo_text(cpus, Path("/proc/cpuinfo").read_text()),
        "cpu-online": cpu_list(cpus) + "\n",
    }
    for name, text in files.items():
        (dest / name).write_text(text)
        os.chmod(dest / name, 0o644)
    return ResourceView(cpus=cpus, dir=str(dest))
