"""The E2B and Modal emulations as soak targets (issue 16): start one, reach into it.

:class:`Emulation` starts a backend's emulator (``tests/emulators``, 127.0.0.1 only,
its sandboxes' commands in bubblewrap as uid 65534), points the real SDK at it through
the environment the proxy kernels inherit, and gives the chaos harness what a cloud
can do to a sandbox: its agent process killed (:meth:`Emulation.kill_agent`), the
whole sandbox hung (:meth:`Emulation.freeze`), the sandbox ended by the service as on
its timeout (:meth:`Emulation.terminate`), the service unreachable for a few seconds
(:meth:`Emulation.outage`).  :meth:`Emulation.leftovers` is what is left after the
kernels shut down: sandboxes the service still runs, state directories.

The emulators are the test suite's, imported from the repository root (on
``sys.path`` when the bench runs).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

#: The soak's names of the emulated targets, by backend.
EMULATED = {"e2b-emulated": "e2b", "modal-emulated": "modal"}


def _tree(pid: int) -> list[int]:
    from sandbox_kernel.backends.local.procs import descendants
    return descendants(pid) if os.path.exists(f"/proc/{pid}") else []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


class Emulation:
    """One running emulator of ``backend`` (``"e2b"`` or ``"modal"``).

    Parameters
    ----------
    backend : str
    memory_mib : int
        The emulated E2B VM's memory (Modal's comes from the kernel's ``memory_mib``), MiB.

    Attributes
    ----------
    env : dict
        The environment variables that point the SDK at this emulator: a kernel started
        with them (``Live(..., env=)``) talks to this instance, so two instances can
        serve two groups of kernels (the quiet ones are kept out of an outage).
    """

    def __init__(self, backend: str, memory_mib: int = 512):
        self.backend = backend
        self.emu: Any
        if backend == "e2b":
            from sandbox_kernel.policy import Policy

            from tests.emulators.e2b_emulator import EmulatorThread
            key = "e2b_soak_" + uuid.uuid4().hex
            self.emu = EmulatorThread(api_key=key, policy=Policy(memory_mib=memory_mib))
            self.env = {"E2B_API_KEY": key, "E2B_API_URL": self.emu.emu.api_url,
                        "E2B_SANDBOX_URL": self.emu.emu.sandbox_url}
        elif backend == "modal":
            from tests.emulators.modal_emulator import ModalEmulator
            self.emu = ModalEmulator(port=0)
            self.env = {"MODAL_SERVER_URL": self.emu.start(), "MODAL_TOKEN_ID": "ak-soak",
                        "MODAL_TOKEN_SECRET": "as-soak"}
        else:
            raise ValueError(f"no emulation of {backend!r}")

    # ---- the sandboxes' host processes ---------------------------------------------------

    def _procs(self, sandbox_id: str) -> list[tuple[int, list[int]]]:
        """(host pid of each command's bubblewrap, its process tree) of a sandbox."""
        if self.backend == "e2b":
            vm = self.emu.emu.vms[sandbox_id]
            return [(p.proc.pid, _tree(p.proc.pid)) for p in list(vm.procs.values())]
        sb = self.emu.state.sandboxes[sandbox_id]
        return [(ex.proc.pid, _tree(ex.proc.pid)) for ex in list(sb.execs.values()) if ex.returncode is None]

    def kill_agent(self, sandbox_id: str) -> None:
        """SIGKILL the agent's command in the sandbox (what an OOM killer or a crash
        inside the VM or container does): its bubblewrap, so its whole process tree."""
        roots = [root for root, tree in self._procs(sandbox_id) if any("agent.pyz" in _cmdline(p) for p in tree)]
        if not roots:
            raise RuntimeError(f"no agent process in {sandbox_id}")
        for pid in roots:
            os.kill(pid, signal.SIGKILL)

    def freeze(self, sandbox_id: str) -> None:
        """SIGSTOP every process of the sandbox: a hung VM or container."""
        pids = [p for _, tree in self._procs(sandbox_id) for p in tree]
        if not pids:
            raise RuntimeError(f"no process in {sandbox_id}")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

    def terminate(self, sandbox_id: str) -> None:
        """The service ends the sandbox, as the cloud does on its timeout."""
        if self.backend == "e2b":
            self.emu.call(self.emu.emu.expire(sandbox_id))
            return
        from modal_proto import api_pb2

        from tests.emulators.modal_emulator import TIMEOUT
        sb = self.emu.state.sandboxes[sandbox_id]
        self.emu.run(self.emu.state.finish(sb, api_pb2.GenericResult(status=TIMEOUT, exception="sandbox timeout")))

    def outage(self, seconds: float) -> None:
        """The service unreachable for ``seconds`` (open streams cut, requests refused);
        returns at once, the service comes back by itself."""
        if self.backend == "e2b":
            self.emu.loop.call_soon_threadsafe(self.emu.emu.outage, seconds)
        else:
            self.emu.run(self.emu.state.outage(seconds))

    # ---- what is left ----------------------------------------------------------------------

    def running(self) -> list[str]:
        """Sandboxes the service still runs (or holds paused)."""
        if self.backend == "e2b":
            return sorted(self.emu.emu.vms)
        return sorted(self.emu.running())

    def state_dirs(self, but: frozenset[str] = frozenset()) -> list[str]:
        """Host directories of the emulated sandboxes (but those of ``but``) that still exist."""
        if self.backend == "e2b":
            dirs = [self._e2b_dir(i) for i in self.emu.emu.created if i not in but]
        else:
            dirs = [sb.fs.root for sid, sb in self.emu.state.sandboxes.items() if sid not in but]
        return [str(d) for d in dirs if d.exists()]

    def _e2b_dir(self, sandbox_id: str) -> Path:
        from sandbox_kernel.backends.local import layout
        return layout.state_base() / f"e2b-emu-{sandbox_id}"

    def leftovers(self, wait_s: float = 0.0, but: frozenset[str] = frozenset()) -> dict[str, list[str]]:
        """Sandboxes still running and state directories, but those of ``but`` (sandbox
        ids), after waiting up to ``wait_s`` for them to go (a sandbox orphaned by a
        killed proxy ends at E2B's dead-man's switch)."""
        def left() -> dict[str, list[str]]:
            return {f"{self.backend}_sandboxes": [i for i in self.running() if i not in but],
                    f"{self.backend}_state_dirs": self.state_dirs(but)}
        deadline = time.monotonic() + wait_s
        while any(left().values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left()

    def created(self) -> int:
        """Sandboxes the service created in all."""
        return len(self.emu.emu.created) if self.backend == "e2b" else len(self.emu.state.sandboxes)

    def close(self) -> None:
        """Stop the emulator, ending whatever it still runs."""
        self.emu.close() if self.backend == "e2b" else self.emu.stop()
