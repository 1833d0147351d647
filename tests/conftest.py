"""Shared fixtures: real kernels through installed kernelspecs, one per local runtime.

Kernelspecs are installed into a temporary prefix that ``JUPYTER_PATH`` points
at, so tests never touch the user's Jupyter configuration.  Every cell runs
inside a sandbox (gVisor or bubblewrap); nothing here executes cell code on
the host.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from jupyter_client.manager import KernelManager

from sandbox_kernel.kernelspec import install

RUNTIMES = ("gvisor", "bubblewrap")


def kernel_name_for(runtime: str, variant: str = "") -> str:
    return f"sandbox-test-{runtime}{('-' + variant) if variant else ''}"


@pytest.fixture(scope="session")
def kernelspec_prefix(tmp_path_factory) -> str:
    """A prefix holding test kernelspecs; ``JUPYTER_PATH`` points at it."""
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(prefix / "share" / "jupyter"), *filter(None, [os.environ.get("JUPYTER_PATH")])])
    for runtime in RUNTIMES:
        install(kernel_name_for(runtime), options={"runtime": runtime}, prefix=str(prefix))
    return str(prefix)


@pytest.fixture(scope="session")
def install_kernelspec(kernelspec_prefix) -> Callable[..., str]:
    """Install an extra kernelspec with policy options; returns its name."""

    def _install(runtime: str, variant: str, **options: Any) -> str:
        name = kernel_name_for(runtime, variant)
        install(name, options={"runtime": runtime, **options}, prefix=kernelspec_prefix)
        return name

    return _install


@dataclass
class Result:
    """What a cell produced, as a frontend sees it."""

    reply: dict
    outputs: list[dict] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def stdout(self) -> str:
        return "".join(o["content"]["text"] for o in self.outputs
                       if o["msg_type"] == "stream" and o["content"]["name"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(o["content"]["text"] for o in self.outputs
                       if o["msg_type"] == "stream" and o["content"]["name"] == "stderr")

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    @property
    def ename(self) -> str | None:
        return self.reply["content"].get("ename")

    def of_type(self, msg_type: str) -> list[dict]:
        return [o for o in self.outputs if o["msg_type"] == msg_type]

    @property
    def result_text(self) -> str | None:
        r = self.of_type("execute_result")
        return r[0]["content"]["data"].get("text/plain") if r else None


class Kernel:
    """A started kernel and a blocking client, with a cell-level helper."""

    def __init__(self, name: str):
        self.name = name
        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=180)

    def execute(self, code: str, timeout: float = 120, allow_stdin: bool = False,
                stdin: Callable[[dict], str] | None = None, interrupt_after: float | None = None,
                stop_on_error: bool = True) -> Result:
        """Run one cell; collect IOPub until idle and the execute_reply."""
        t0 = time.monotonic()
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin, stop_on_error=stop_on_error)
        interrupted = interrupt_after is None
        res = Result(reply={})
        idle = False
        deadline = t0 + timeout
        while not (idle and res.reply):
            if not interrupted and time.monotonic() - t0 >= interrupt_after:
                self.km.interrupt_kernel()
                interrupted = True
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell did not finish in {timeout} s: {code[:60]!r}")
            if stdin is not None:
                try:
                    req = self.kc.get_stdin_msg(timeout=0.01)
                    self.kc.input(stdin(req))
                except queue.Empty:
                    pass
            try:
                m = self.kc.get_iopub_msg(timeout=0.05)
                if m["parent_header"].get("msg_id") == msg_id:
                    if m["msg_type"] == "status":
                        res.statuses.append(m["content"]["execution_state"])
                        idle = m["content"]["execution_state"] == "idle"
                    else:
                        if res.reply:
                            res.outputs.append({**m, "_after_reply": True})
                        else:
                            res.outputs.append(m)
            except queue.Empty:
                pass
            if not res.reply:
                try:
                    r = self.kc.get_shell_msg(timeout=0.01)
                    if r["parent_header"].get("msg_id") == msg_id:
                        res.reply = r
                        res.elapsed_s = time.monotonic() - t0
                except queue.Empty:
                    pass
        return res

    def sandbox_info(self) -> dict:
        """kernel_info's ``sandbox`` field (answered by the proxy: never wakes the sandbox)."""
        return self.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


@pytest.fixture(params=RUNTIMES)
def runtime(request) -> str:
    return request.param


@pytest.fixture
def kernel(kernelspec_prefix, runtime):
    """A fresh sandboxed kernel on each local runtime."""
    k = Kernel(kernel_name_for(runtime))
    yield k
    k.shutdown()


@pytest.fixture
def start_kernel(kernelspec_prefix):
    """Factory for kernels of a given kernelspec name; all shut down at teardown."""
    started: list[Kernel] = []

    def _start(name: str) -> Kernel:
        k = Kernel(name)
        started.append(k)
        return k

    yield _start
    for k in started:
        k.shutdown()


_SESSION_START = time.time()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a test left a sandbox behind (state dir whose proxy is gone)."""
    from sandbox_kernel.backends.local.reaper import orphans

    deadline = time.time() + 15  # watchdogs reap asynchronously
    while True:
        leaked = [d for d, tag in orphans() if tag.get("created_at", 0) >= _SESSION_START]
        if not leaked or time.time() > deadline:
            break
        time.sleep(0.5)
    if leaked:
        print(f"\nleaked sandboxes (state dirs whose proxy is gone): {[d.name for d in leaked]}")
        session.exitstatus = 1
