"""``doctor`` on a Ray node: whether this machine can host the Ray backend's sandboxes.

Fast: no cluster is started and no sandbox either; the runtime's own probe
(``runsc do /bin/true``, cached per binary) runs for real, on this machine's runsc
and on binaries that are not a working runsc.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import uuid

import pytest
from sandbox_kernel import doctor
from sandbox_kernel.backends.local import runsc
from sandbox_kernel.backends.ray.node import host_report
from sandbox_kernel.policy import Policy

pytest.importorskip("ray")


@pytest.mark.skipif(not runsc.have_runsc(), reason="no runsc on this machine")
def test_this_machine_can_host_gvisor_sandboxes():
    from importlib.metadata import version

    from sandbox_kernel.backends.ray import RayBackend

    report = asyncio.run(RayBackend(Policy(), uuid.uuid4().hex).host_report())
    assert report["can_host"] and report["runtime"] == "gvisor" and report["problems"] == [], report
    found = "\n".join(report["facts"])
    assert f"ray {version('ray')} importable" in found and runsc.find_runsc() in found
    assert "`runsc do /bin/true` runs here" in found
    if os.geteuid() != 0:
        assert any("rootless" in n for n in report["notes"]), report["notes"]
    lines = doctor.host_lines("ray", report)
    assert lines.startswith("       this machine can host ray sandboxes (gvisor):"), lines


def test_a_missing_runsc_is_named_with_the_fix(tmp_path):
    not_executable = tmp_path / "runsc"
    not_executable.write_text("")
    report = host_report("gvisor", str(not_executable))
    assert not report["can_host"] and report["runtime"] is None
    (problem,) = report["problems"]
    assert f"RayBackend.runsc_path={str(not_executable)!r}" in problem and "scripts/setup.sh" in problem
    assert "can NOT host ray sandboxes" in doctor.host_lines("ray", report)


def test_a_runsc_that_does_not_run_here_is_refused_and_auto_falls_back(tmp_path):
    broken = tmp_path / "runsc"
    broken.write_text("#!/bin/sh\nexit 1\n")  # executable, but no runsc: its `do /bin/true` fails
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    report = host_report("gvisor", str(broken))
    assert not report["can_host"]
    assert any("does not run here" in p and str(broken) in p for p in report["problems"]), report["problems"]

    auto = host_report("auto", str(broken))
    if shutil.which("bwrap"):
        assert auto["can_host"] and auto["runtime"] == "bubblewrap", auto
        assert any(n.startswith("gVisor unusable, bubblewrap in force") for n in auto["notes"]), auto["notes"]
    else:
        assert not auto["can_host"] and any("bwrap not found" in p for p in auto["problems"])


def test_doctor_reports_the_host_only_for_backends_that_have_hosts():
    entry = doctor.backend_entry("ray")
    assert entry["available"] and set(entry["host"]) == {"can_host", "runtime", "facts", "problems", "notes"}
    assert doctor.backend_entry("local")["host"] is None
