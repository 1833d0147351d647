"""The inner kernel's entry point: stock ipykernel, patched and warmed.

Runs inside the user's interpreter (``agent.pyz --kernel -f CONN``).
"""

from __future__ import annotations

import os
import signal

from .clone import RESEED_SIGNAL, after_clone, track_seeds
from .patches import apply_all
from .warm import explain_pip, import_shared_lazy_modules, seed_jedi_cache, seed_matplotlib_fonts, warm_tracebacks


def run_inner_kernel(argv: list[str]) -> None:
    """Entry point of the inner kernel process."""
    track_seeds()
    signal.signal(RESEED_SIGNAL, after_clone)
    seed_jedi_cache()
    seed_matplotlib_fonts()
    apply_all()
    import threading

    from ipykernel import kernelapp

    start = kernelapp.IPKernelApp.start

    def start_then_warm(self):
        # Only once initialize() has imported IPython on this thread: a second
        # thread importing it concurrently made the kernel exit at start (code 1).
        import_shared_lazy_modules()
        threading.Thread(target=warm_tracebacks, name="warm-tracebacks", daemon=True).start()
        if not os.environ.get("SANDBOX_KERNEL_EGRESS"):  # with egress, pip may install
            explain_pip(self.shell)
        return start(self)

    kernelapp.IPKernelApp.start = start_then_warm
    kernelapp.launch_new_instance(argv=argv)
