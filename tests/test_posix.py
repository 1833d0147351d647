"""What a normal Linux process expects of its system, on both local runtimes (issue 18 item 6).

One table (``tests/posix_table.py``): devices, a writable ``/dev/shm``, a passwd and
group entry for the sandbox user with a writable home, the time zone database,
a UTF-8 locale, ``localhost``, CA certificates, every multiprocessing start
method giving the stock result, shared memory; and CPUs and memory as the
limits say (``os.cpu_count()``, affinity, ``/proc/meminfo``).  The E2B and
Modal emulations run the same table in tests/backends/test_cloud_kernels.py.
"""

from __future__ import annotations

import pytest
from kernels import Kernel
from posix_table import mismatches, probe


@pytest.fixture(scope="module")
def limited(install_kernelspec):
    return {rt: install_kernelspec(rt, "posix", memory_mib=1536, cpu_cores=1.0) for rt in ("gvisor", "bubblewrap")}


def test_posix_facilities_as_on_a_normal_machine(runtime, limited):
    k = Kernel(limited[runtime])
    try:
        seen = probe(k)
    finally:
        k.shutdown()
    assert mismatches(seen) == {}
    # CPUs and memory as the limits say: what pools, caches and psutil size themselves by
    assert seen["cpu_count"] == 1 and seen["sched_affinity"] == 1, seen
    assert seen["mem_total_mib"] == 1536, seen
    # sysconf(_SC_PHYS_PAGES) asks the kernel (sysinfo(2)): gVisor answers with the limit,
    # bubblewrap shares the host kernel, which answers with the host's memory (docs/security.md)
    if runtime == "gvisor":
        assert seen["sysconf_pages_mib"] == 1536, seen
