"""The ``sandbox_kernel.files`` comm on the E2B and Modal emulations: the same agent
ops as on local sandboxes, through each SDK's own stdio transport (the real SDKs,
pointed at emulated services on 127.0.0.1; sandboxes are bubblewrap as uid 65534)."""

from __future__ import annotations

import pytest
from kernels import Kernel
from sandbox_kernel.kernelspec import install
from test_files_comm import round_trip


@pytest.mark.parametrize("backend", ["e2b", "modal"])
def test_20_mib_up_and_down_on_the_emulations(backend, request, kernelspec_prefix):
    request.getfixturevalue(f"{backend}_emulator")
    name = f"sandbox-test-{backend}-files"
    install(name, backend=backend, prefix=kernelspec_prefix)
    k = Kernel(name)
    try:
        round_trip(k)
    finally:
        k.shutdown()
