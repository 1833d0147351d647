"""Fixtures shared by the cloud backend tests: the emulated E2B and Modal services.

Each emulator listens on 127.0.0.1 only, runs its sandboxes' commands in
bubblewrap as uid 65534 (never on the host), and is reached by the real SDK
through the environment variables set here.  The variables are set on this
process's environment (``monkeypatch``), so a kernel started by the test
through ``jupyter_client`` inherits them, as a proxy launched by Jupyter would.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

bwrap_missing = shutil.which("bwrap") is None



def _e2b(monkeypatch, vm: str):
    from tests.emulators.e2b_emulator import EmulatorThread

    key = "e2b_emulated_" + uuid.uuid4().hex
    emu = EmulatorThread(api_key=key, vm=vm)
    monkeypatch.setenv("E2B_API_KEY", key)
    monkeypatch.setenv("E2B_API_URL", emu.emu.api_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", emu.emu.sandbox_url)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    yield emu
    vms = list(emu.emu.vms.values())
    emu.close()
    for v in vms:
        assert not v.state_dir.exists()


@pytest.fixture
def e2b_emulator(monkeypatch):
    """An E2B emulation on random 127.0.0.1 ports; the SDK is pointed at it.

    Sets ``E2B_API_KEY`` (a fake key the emulator accepts), ``E2B_API_URL``
    and ``E2B_SANDBOX_URL``.  Cleanup kills every sandbox the emulator created
    and checks none left a state directory behind.
    """
    if bwrap_missing:
        pytest.skip("bubblewrap is not installed")
    yield from _e2b(monkeypatch, "bubblewrap")


@pytest.fixture
def e2b_gvisor_emulator(monkeypatch):
    """The E2B emulation whose microVMs are gVisor sandboxes (:mod:`tests.emulators.e2b_gvisor_vm`),
    which ``fork`` and ``create_snapshot`` copy; otherwise as :func:`e2b_emulator`."""
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("the copyable E2B emulation needs root and runsc (rootless runsc cannot restore)")
    yield from _e2b(monkeypatch, "gvisor")


@pytest.fixture
def modal_emulator(monkeypatch):
    """The emulated Modal API on 127.0.0.1:<random>, the client pointed at it
    (``MODAL_SERVER_URL``, fake ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``, also
    kept as ``emu.token_id``/``emu.token_secret``: they must never reach a sandbox)."""
    if bwrap_missing:
        pytest.skip("the emulated sandbox needs bubblewrap")
    from tests.emulators.modal_emulator import ModalEmulator

    emu = ModalEmulator(port=0)
    url = emu.start()
    emu.token_id = "ak-" + "emulatedtokenid" + uuid.uuid4().hex[:8]
    emu.token_secret = "as-" + "emulatedsecret" + uuid.uuid4().hex[:8]
    monkeypatch.setenv("MODAL_SERVER_URL", url)
    monkeypatch.setenv("MODAL_TOKEN_ID", emu.token_id)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", emu.token_secret)
    monkeypatch.delenv("MODAL_PROFILE", raising=False)
    try:
        yield emu
    finally:
        emu.stop()  # terminates every sandbox still running
        assert not emu.running()
