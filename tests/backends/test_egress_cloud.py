"""Egress by domain (issue 17) on E2B and Modal: the policy reaches each SDK's call.

Both run against the local emulations (``tests/emulators/``), which record what
the SDK sent; no network is involved (the emulated sandboxes are bubblewrap,
without any).  What each provider enforces is said in ``docs/security.md``.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid

import pytest
from sandbox_kernel.backends.base import EGRESS_FIELDS
from sandbox_kernel.policy import Policy

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the emulated sandbox needs bubblewrap")

ALLOW = Policy(network="allowlist", allow_domains=("pypi.org", "*.pythonhosted.org", "93.184.215.14", "10.0.0.1"))


def test_e2b_maps_the_allowlist(e2b_emulator):
    from sandbox_kernel.backends.e2b import E2BBackend, network_options

    assert network_options(Policy()) == {"allow_internet_access": False}
    assert network_options(Policy(network="allowlist")) == {"allow_internet_access": False}
    assert network_options(ALLOW) == {"allow_internet_access": True, "network": {
        "allow_out": ["pypi.org", "*.pythonhosted.org", "93.184.215.14"], "deny_out": ["0.0.0.0/0"]}}
    unenforced = {"allow_ports", "max_egress_connections_per_cell", "max_egress_bytes_per_cell"}
    assert set(E2BBackend.check_policy(ALLOW)) & EGRESS_FIELDS == unenforced  # egress_resolve: empty
    assert set(E2BBackend.check_policy(Policy())) & EGRESS_FIELDS == set()

    async def main():
        b = E2BBackend(ALLOW, kernel_id=uuid.uuid4().hex)
        await b.start()
        try:
            vm = e2b_emulator.emu.vms[b.sandbox_id]
            assert vm.network == {"allowOut": ["pypi.org", "*.pythonhosted.org", "93.184.215.14"],
                                  "denyOut": ["0.0.0.0/0"]}, vm.network
            assert vm.allow_internet is False  # the emulator's reading: all but allow_out denied
            egress = b.describe()["egress"]
            assert egress["network"] == "allowlist" and "8.8.8.8" in egress["enforced"]
        finally:
            await b.kill()

    asyncio.run(asyncio.wait_for(main(), 300))


def test_modal_maps_the_allowlist(modal_emulator):
    from modal_proto import api_pb2
    from sandbox_kernel.backends.modal import ModalBackend, network_kwargs

    assert network_kwargs(Policy()) == {"block_network": True}
    assert network_kwargs(ALLOW) == {"block_network": False,
                                     "outbound_domain_allowlist": ["pypi.org", "*.pythonhosted.org"],
                                     "outbound_cidr_allowlist": ["93.184.215.14/32"]}
    assert set(ModalBackend.check_policy(ALLOW)) & EGRESS_FIELDS == {
        "allow_ports", "max_egress_connections_per_cell", "max_egress_bytes_per_cell"}

    async def main():
        b = ModalBackend(ALLOW, kernel_id=f"test-{uuid.uuid4().hex[:8]}")
        await b.start()
        await b.kill()

    asyncio.run(asyncio.wait_for(main(), 300))
    d = list(modal_emulator.state.sandboxes.values())[-1].definition
    assert d.network_access.network_access_type == api_pb2.NetworkAccess.ALLOWLIST
    assert list(d.network_access.allowed_domains) == ["pypi.org", "*.pythonhosted.org"]
    assert list(d.network_access.allowed_cidrs) == ["93.184.215.14/32"]
