"""The agent client's quick-start flow on the E2B and Modal backends (their local emulations).

The real SDKs talk to emulators on 127.0.0.1 (``conftest.py``); the sandboxes
behind them are bubblewrap, so every cell runs inside a sandbox.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("e2b_code_interpreter")
pytest.importorskip("modal")

from client_flow import files_flow, quickstart_flow
from sandbox_kernel import Sandbox
from sandbox_kernel.kernelspec import install


@pytest.mark.parametrize("backend", ["e2b", "modal"])
def test_quickstart_flow_on_cloud_backend(backend, request, kernelspec_prefix, tmp_path):
    emu = request.getfixturevalue(f"{backend}_emulator")
    name = f"sandbox-test-{backend}-client"
    install(name, backend=backend, prefix=kernelspec_prefix)
    with Sandbox(name) as sbx:
        info = sbx.info()
        assert info.backend == backend and info.state == "running" and info.boundary, info
        assert info.egress == "none" and info.limits
        quickstart_flow(sbx)
        files_flow(sbx, tmp_path)
    # closing the client shut the kernel down, and the kernel its sandbox
    deadline = time.monotonic() + 30
    while (emu.running() if backend == "modal" else emu.emu.vms) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (emu.running() if backend == "modal" else emu.emu.vms)
