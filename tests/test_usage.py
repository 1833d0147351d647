"""JupyterLab's resource panel asks the kernel ``usage_request`` (jupyter-resource-usage):
the proxy answers with the sandbox's limits and use, never the host's name, CPUs or
memory; and each cell's ``execute_reply`` says what the cell cost (issue 33).  Every
figure here is checked against what the user set and did."""

from __future__ import annotations

import socket
import time

import psutil
from sandbox_kernel.backends.base import Usage
from sandbox_kernel.policy import Policy
from sandbox_kernel.usage import UsageReporter, cell_usage

MIB = 1 << 20


def _usage(kernel) -> dict:
    kc = kernel.kc
    msg = kc.session.msg("usage_request", {})
    kc.control_channel.send(msg)
    deadline = time.monotonic() + 60
    while True:
        r = kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
        if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            assert r["msg_type"] == "usage_reply"
            return r["content"]


def test_the_resource_panel_sees_the_sandbox_not_the_host(shared_kernel):
    limits = shared_kernel.sandbox_info()["limits"]
    before = _usage(shared_kernel)
    assert before["hostname"] == "sandbox" != socket.gethostname()
    limit = limits["memory_mib"] * MIB
    assert before["host_virtual_memory"]["total"] == limit != psutil.virtual_memory().total
    assert before["cpu_count"] == max(1, -(-limits["cpu_cores"] // 1))
    assert before["sandbox"]["measured"] is True and before["sandbox"]["source"] == "cgroup"
    assert 0 < before["kernel_memory"] < limit
    r = shared_kernel.execute("import time\nblock = bytearray(200 * 2**20)\nt = time.process_time()\n"
                              "while time.process_time() - t < 1.0: pass")  # 1 s of CPU, however loaded
    assert r.status == "ok", r.reply["content"]
    after = _usage(shared_kernel)
    cell = r.reply["metadata"]["sandbox_usage"]  # what that cell cost, in its own reply
    try:
        assert cell["measured"] is True and cell["memory_limit_bytes"] == limit, cell
        # the host's cgroup charges less than the guest's clock counts under load (gVisor): half of
        # the burned second is far above an idle cell's ~0.01 s
        assert cell["cpu_s"] >= 0.5 and cell["wall_s"] >= 1.0, cell
        assert cell["memory_peak_bytes"] - before["kernel_memory"] > 150 * MIB, (before, cell)
        assert cell["memory_bytes"] <= cell["memory_peak_bytes"] <= limit, cell
        assert after["kernel_memory"] - before["kernel_memory"] > 150 * MIB, (before, after)
        assert after["host_virtual_memory"]["used"] == min(after["kernel_memory"], limit)
        assert after["sandbox"]["cpu_seconds"] - before["sandbox"]["cpu_seconds"] >= 0.5, (before, after)
        assert after["kernel_cpu"] > 0, after
    finally:
        assert shared_kernel.execute("del block").status == "ok"


def test_a_backend_that_cannot_measure_gives_the_limits_only():
    reporter = UsageReporter()
    policy = Policy(memory_mib=512, cpu_cores=1.5)
    content = reporter.reply(policy, None)
    assert content == {"hostname": "sandbox", "cpu_count": 2, "host_virtual_memory": {"total": 512 * MIB},
                       "sandbox": {"memory_limit_bytes": 512 * MIB, "cpu_cores": 1.5, "measured": False}}
    first = reporter.reply(policy, Usage(100 * MIB, 10.0, "cgroup"))
    assert first["kernel_cpu"] == 0.0  # as psutil's first cpu_percent: no interval yet
    assert first["host_virtual_memory"]["available"] == 412 * MIB
    assert first["host_virtual_memory"]["percent"] == round(100 * 100 / 512, 1)


def test_a_cell_that_cannot_be_measured_says_so_and_gives_the_limits():
    policy = Policy(memory_mib=256, cpu_cores=1)
    assert cell_usage(policy, None, None, 0.5) == {"measured": False, "wall_s": 0.5,
                                                   "memory_limit_bytes": 256 * MIB, "cpu_cores": 1}
    got = cell_usage(policy, Usage(50 * MIB, 1.0, "cgroup", 60 * MIB), Usage(80 * MIB, 1.5, "cgroup", 120 * MIB), 2.0)
    assert got["cpu_s"] == 0.5 and got["cpu_percent"] == 25.0
    assert got["memory_bytes"] == 80 * MIB and got["memory_peak_bytes"] == 120 * MIB
