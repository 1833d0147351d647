"""The kernel harness: a run's state, a started kernel with its timer, what a figure gets."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.cells import Timer
from bench.targets import Target


def say(msg: str) -> None:
    """A progress line on stdout."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Bench:
    """Run state: where kernelspecs live, logs, mode."""

    def __init__(self, quick: bool, log_path: Path):
        self.quick = quick
        self.prefix = tempfile.mkdtemp(prefix="sandbox-bench-")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            [str(Path(self.prefix) / "share" / "jupyter"), *filter(None, [os.environ.get("JUPYTER_PATH")])])
        self.log = open(log_path, "ab")
        import zmq
        # Reconnect quickly when a client connects before the kernel has bound its ports
        # (cold start): the default 100 ms retry would quantize every cold-start figure.
        zmq.Context.instance().setsockopt(zmq.RECONNECT_IVL, 5)

    def close(self) -> None:
        self.log.close()
        shutil.rmtree(self.prefix, ignore_errors=True)


class Running:
    """A started kernel with a connected client and a Timer."""

    def __init__(self, bench: Bench, target: Target):
        from jupyter_client.manager import KernelManager
        self.t_launch = time.perf_counter()
        self.km = KernelManager(kernel_name=target.kernel_name)
        self.km.start_kernel(stdout=bench.log, stderr=bench.log)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.timer = Timer(self.kc)

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid  # type: ignore[union-attr]

    def first_reply_s(self, timeout: float = 180.0) -> float:
        """Send ``pass`` right away and wait for its execute_reply; seconds since launch."""
        _, reply = self.timer.request(lambda: self.kc.execute("pass", store_history=False),
                                      wait_idle=False, timeout=timeout)
        dt = time.perf_counter() - self.t_launch
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"first cell failed: {reply['content']}")
        return dt

    def ensure_iopub(self, timeout: float = 60.0) -> None:
        """Make sure IOPub is subscribed (as ``wait_for_ready`` does): a message published
        before the SUB socket's subscription reached the kernel is lost, and a cell whose
        ``idle`` is lost would never end."""
        deadline = time.perf_counter() + timeout
        while True:
            try:
                self.timer.request(self.kc.kernel_info, wait_idle=True, timeout=1.0)
                return
            except TimeoutError:
                if time.perf_counter() > deadline:
                    raise

    def run(self, code: str, timeout: float = 300.0) -> tuple[float, dict, list[dict]]:
        outputs: list[dict] = []
        dt, reply = self.timer.execute(code, on_iopub=outputs.append, timeout=timeout)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {reply['content'].get('ename')}: "
                               f"{reply['content'].get('evalue')}")
        return dt, reply, outputs

    def stop(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=False)


@dataclass
class Context:
    """What a figure function gets: the target, the run, and a shared kernel on demand."""

    bench: Bench
    target: Target
    _session: Running | None = None

    @property
    def session(self) -> Running:
        if self._session is None:
            self._session = Running(self.bench, self.target)
            self._session.first_reply_s()
            self._session.ensure_iopub()
            self._session.run("pass")
        return self._session

    def launch(self) -> Running:
        return Running(self.bench, self.target)

    def close(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None


def sandbox_info(k: Running, timeout: float = 60.0) -> dict:
    """kernel_info's ``sandbox`` field (answered by the proxy: never wakes the sandbox)."""
    _, reply = k.timer.request(k.kc.kernel_info, wait_idle=False, timeout=timeout)
    return reply["content"]["sandbox"]


def wait_state(k: Running, state: str, timeout: float = 120.0) -> dict:
    """Poll :func:`sandbox_info` until the sandbox is in ``state``; its last answer."""
    deadline = time.perf_counter() + timeout
    while True:
        info = sandbox_info(k)
        if info["state"] == state:
            return info
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the sandbox never reached {state!r}: {info}")
        time.sleep(0.05)


def timed_cell(k: Running, code: str, expect: str, timeout: float = 180.0) -> float:
    """Send ``code`` and wait for its execute_reply only (what the user waits for before
    the cell's result), checking ``x`` through user_expressions; seconds."""
    dt, reply = k.timer.request(
        lambda: k.kc.execute(code, store_history=False, user_expressions={"x": "x"}),
        wait_idle=False, timeout=timeout)
    c = reply["content"]
    if c["status"] != "ok":
        raise RuntimeError(f"cell failed: {c.get('ename')}: {c.get('evalue')}")
    got = c["user_expressions"]["x"].get("data", {}).get("text/plain")
    if got != expect:
        raise RuntimeError(f"state lost: x is {got!r}, expected {expect!r} ({c['user_expressions']})")
    return dt
