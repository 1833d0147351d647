"""What is measured: ``TARGETS``, one kernelspec each.

**Extension point**: a new target (e.g. a warm pool, a new backend) is a ``Target``
added to ``TARGETS``, with ``setup``/``teardown`` to install its kernelspec or start
the service it needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench import raycluster

if TYPE_CHECKING:
    from bench.harness import Bench


@dataclass
class Target:
    """A kernel to measure, by kernelspec name."""

    name: str
    label: str
    kernel_name: str
    description: str
    #: runs once before the target is measured (install a kernelspec, start an emulator...)
    setup: Callable[["Bench"], None] | None = None
    teardown: Callable[["Bench"], None] | None = None
    #: True for cloud backends reached through a local emulation of their service
    emulated: bool = False
    #: the runtime this target rides on, for the relay-overhead check ("" = none)
    runtime: str = ""
    #: of the figures meant for every target (``Figure.targets`` None), those that apply to
    #: this one (None = all); figures that name the target apply anyway
    figures: tuple[str, ...] | None = None


def _install_sandbox_spec(runtime: str, name: str = "", **options: Any) -> Callable[["Bench"], None]:
    def setup(bench: "Bench") -> None:
        from sandbox_kernel.kernelspec import install
        install(f"sandbox-bench-{name or runtime}", options={"runtime": runtime, **options}, prefix=bench.prefix)
    return setup


def _old_runsc() -> str:
    """The system's runsc (Debian 12's 20221219, ptrace only) for the ``gvisor-ptrace`` target."""
    import shutil
    return shutil.which("runsc") or "/usr/bin/runsc"


TARGETS: dict[str, Target] = {
    "stock": Target("stock", "stock ipykernel", "python3",
                    "stock ipykernel on the host (kernelspec python3): the limit"),
    "bubblewrap": Target("bubblewrap", "proxy + bubblewrap", "sandbox-bench-bubblewrap",
                         "sandbox-kernel proxy, local backend, bubblewrap (namespaces + seccomp)",
                         setup=_install_sandbox_spec("bubblewrap", spare_sandbox=False), runtime="bubblewrap"),
    "gvisor": Target("gvisor", "proxy + gVisor", "sandbox-bench-gvisor",
                     "sandbox-kernel proxy, local backend, gVisor with the runsc and platform auto "
                     "chooses (a current runsc on systrap where it has one: each figure names the runsc it was "
                     "measured on); spare sandboxes and start templates off, so every start is cold and no "
                     "spare starts beside what is measured (template_start and restart measure the default "
                     "kernelspec's fast starts)",
                     setup=_install_sandbox_spec("gvisor", spare_sandbox=False, start_template=False),
                     runtime="gvisor"),
    "gvisor-ptrace": Target("gvisor-ptrace", "proxy + gVisor (old runsc, ptrace)", "sandbox-bench-gvisor-ptrace",
                            "the same on the system's runsc (Debian 12's 20221219) forced to the ptrace "
                            "platform with the statx shim: what the platform change gained",
                            setup=_install_sandbox_spec("gvisor", "gvisor-ptrace", runsc_path=_old_runsc(),
                                                                  gvisor_platform="ptrace", start_template=False),
                            runtime="gvisor"),
    "e2b-emulated": Target("e2b-emulated", "proxy + E2B (emulated)", "sandbox-bench-e2b-emulated",
                           "sandbox-kernel proxy, E2B backend through the real e2b SDK against "
                           "tests/emulators/e2b_emulator.py on loopback (sandbox = bubblewrap)",
                           setup=lambda b: _cloud_setup(b, "e2b"),
                           teardown=lambda b: _cloud_teardown(b, "e2b"), emulated=True),
    "modal-emulated": Target("modal-emulated", "proxy + Modal (emulated)", "sandbox-bench-modal-emulated",
                             "sandbox-kernel proxy, Modal backend through the real modal client "
                             "against tests/emulators/modal_emulator.py on loopback (sandbox = "
                             "bubblewrap)",
                             setup=lambda b: _cloud_setup(b, "modal"),
                             teardown=lambda b: _cloud_teardown(b, "modal"), emulated=True),
    "ray": Target("ray", "proxy + Ray (local cluster)", "sandbox-bench-ray", raycluster.describe(),
                  setup=raycluster.setup, teardown=raycluster.teardown,
                  # issue 31's three; the memory figures would read the proxy's tree, which
                  # holds no sandbox here (it is under a Ray worker)
                  figures=("cold_start", "trivial_rtt", "image_rtt")),
    # ---- EXTENSION POINT: more targets -------------------------------------------------
    # e.g. "warm-pool-gvisor" (proxy with a pool of pre-started sandboxes).
}

#: Running cloud emulators by backend, with the environment variables set for them.
_EMULATORS: dict[str, tuple[Any, list[str]]] = {}


def _cloud_setup(bench: "Bench", backend: str) -> None:
    """Start the backend's emulator in this process (127.0.0.1 only) and point the SDK at
    it through the environment the proxy kernels inherit; install the kernelspec.

    The emulators are the test suite's (``tests/emulators``), imported from the
    repository root, which is on ``sys.path`` when the bench runs (``bench/run.py``
    puts it there; ``python -m bench.run`` runs from it)."""
    from sandbox_kernel.kernelspec import install
    if backend == "e2b":
        from tests.emulators.e2b_emulator import EmulatorThread
        key = "e2b_bench_" + os.urandom(8).hex()
        emu: Any = EmulatorThread(api_key=key)
        env = {"E2B_API_KEY": key, "E2B_API_URL": emu.emu.api_url, "E2B_SANDBOX_URL": emu.emu.sandbox_url}
    else:
        from tests.emulators.modal_emulator import ModalEmulator
        emu = ModalEmulator(port=0)
        env = {"MODAL_SERVER_URL": emu.start(), "MODAL_TOKEN_ID": "ak-bench", "MODAL_TOKEN_SECRET": "as-bench"}
    os.environ.update(env)
    _EMULATORS[backend] = (emu, list(env))
    install(f"sandbox-bench-{backend}-emulated", backend=backend, prefix=bench.prefix,
            options={"pause_after_s": 0, "checkpoint_after_s": 0, "stop_after_s": 0})


def _cloud_teardown(bench: "Bench", backend: str) -> None:
    emu, names = _EMULATORS.pop(backend, (None, []))
    try:
        if emu is not None:
            emu.close() if backend == "e2b" else emu.stop()
    finally:
        for name in names:
            os.environ.pop(name, None)
