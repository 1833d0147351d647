"""What a local sandbox is told about its CPUs and memory (C15): the pure parts.

The end-to-end check, through a kernel on both runtimes, is
``test_cases.py::test_c15_code_sees_the_sandbox_limits``.
"""

from __future__ import annotations

import collections

import pytest
from sandbox_kernel.backends.local.resource_view import (
    MEMINFO_FIELDS,
    cpu_list,
    cpuinfo_text,
    meminfo_text,
    sandbox_cpus,
)
from sandbox_kernel.policy import Policy

HOST_MEMINFO = ("MemTotal:       24684092 kB\nMemFree:        19855424 kB\n"
                "MemAvailable:   24042220 kB\nBuffers:           71404 kB\nCached:          3685664 kB\n")


@pytest.mark.parametrize("cores, expected", [(0.5, 1), (1, 1), (1.5, 2), (2, 2), (3.2, 4), (64, 8)])
def test_cpus_are_the_cores_rounded_up_at_most_all(cores, expected):
    cpus = sandbox_cpus(Policy(cpu_cores=cores), "k", available=range(8))
    assert len(cpus) == expected and set(cpus) <= set(range(8))


def test_cpus_are_consecutive_from_an_offset_the_name_chooses():
    assert sandbox_cpus(Policy(cpu_cores=2), "same", available=range(8)) == \
        sandbox_cpus(Policy(cpu_cores=2), "same", available=range(8))
    for key in ("a", "b", "c", "d"):
        cpus = sandbox_cpus(Policy(cpu_cores=3), key, available=[0, 2, 4, 6])  # only the proxy's own
        assert set(cpus) <= {0, 2, 4, 6}
        assert len(cpus) == 3


def test_one_core_kernels_spread_over_the_host():
    """Not every one-core kernel on CPU 0: 2000 kernel ids over 8 CPUs land 250 +- 60 each."""
    counts = collections.Counter(
        sandbox_cpus(Policy(cpu_cores=1), f"sandbox-kernel-{i:012x}-abcdef", available=range(8))[0]
        for i in range(2000))
    assert set(counts) == set(range(8))
    assert all(190 <= n <= 310 for n in counts.values()), counts


def test_cpu_list_format():
    assert cpu_list([1]) == "1"
    assert cpu_list([0, 1]) == "0-1"
    assert cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_meminfo_shows_the_limit_and_every_field_libraries_read():
    text = meminfo_text(1024, HOST_MEMINFO)
    fields = {line.split(":")[0]: line.split()[1:] for line in text.splitlines()}
    assert list(fields) == list(MEMINFO_FIELDS)
    assert all(v[1:] == ["kB"] and v[0].isdigit() for v in fields.values())
    assert fields["MemTotal"][0] == "1048576" and text.startswith("MemTotal:        1048576 kB\n")
    assert fields["MemFree"][0] == fields["MemAvailable"][0] == "1048576"
    assert fields["SwapTotal"][0] == fields["SwapFree"][0] == fields["Cached"][0] == "0"


def test_meminfo_never_shows_more_than_the_host_has():
    small_host = "MemTotal:         524288 kB\nMemFree:          10000 kB\nMemAvailable:     300000 kB\n"
    text = meminfo_text(1024, small_host)
    assert "MemTotal:         524288 kB" in text and "MemAvailable:     300000 kB" in text
    assert "MemFree:          300000 kB" in text


def test_cpuinfo_keeps_only_the_sandbox_cpus():
    host = "".join(f"processor\t: {i}\nmodel name\t: X\nsiblings\t: 4\ncore id\t\t: {i}\ncpu cores\t: 4\n\n"
                   for i in range(4))
    text = cpuinfo_text((1, 2), host)
    blocks = text.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["processor\t: 1", "processor\t: 2"]
    assert "siblings\t: 2" in blocks[0] and "cpu cores\t: 2" in blocks[1] and "siblings\t: 4" not in text
