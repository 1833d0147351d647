"""Kernels for tests: a started kernel and a cell-level client, as a frontend sees them.

A plain module (``from kernels import Kernel``), not fixtures: the fixtures in
``conftest.py`` and any test build on these.  Every cell runs inside a
sandbox (the kernels are sandbox-kernel kernelspecs); nothing here executes
cell code on the host.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import AsyncKernelManager, KernelManager
from sandbox_kernel.client.transport import ipc_endpoints, local_manager
from sandbox_kernel.sandbox_state import PROGRESS_METADATA

RUNTIMES = ("gvisor", "bubblewrap")


def kernel_name_for(runtime: str, variant: str = "") -> str:
    return f"sandbox-test-{runtime}{('-' + variant) if variant else ''}"


@dataclass
class Result:
    """What a cell produced, as a frontend sees it."""

    reply: dict
    outputs: list[dict] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: Seconds from the request to the interrupt the caller asked for (None: none sent).
    interrupt_s: float | None = None

    @property
    def after_interrupt_s(self) -> float:
        """Seconds from the interrupt to the reply: how long the cell took to end."""
        assert self.interrupt_s is not None, "no interrupt was sent"
        return self.elapsed_s - self.interrupt_s

    @property
    def shown(self) -> list[dict]:
        """The outputs a frontend keeps once ``clear_output`` is applied (spec, "Clear
        output"): ``wait=False`` clears at once, ``wait=True`` when the next output comes."""
        kept: list[dict] = []
        clear_on_next = False
        for o in self.outputs:
            if o["msg_type"] == "clear_output":
                if o["content"].get("wait"):
                    clear_on_next = True
                else:
                    kept.clear()
                continue
            if clear_on_next:
                kept.clear()
                clear_on_next = False
            kept.append(o)
        return kept

    @property
    def stdout(self) -> str:
        return "".join(o["content"]["text"] for o in self.shown
                       if o["msg_type"] == "stream" and o["content"]["name"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(o["content"]["text"] for o in self.shown
                       if o["msg_type"] == "stream" and o["content"]["name"] == "stderr")

    def progress(self) -> list[str]:
        """The lines the kernel showed while the cell waited for its sandbox (cleared since)."""
        return [o["content"]["data"]["text/plain"] for o in self.outputs
                if o["msg_type"] in ("display_data", "update_display_data")
                and (o["content"].get("metadata") or {}).get(PROGRESS_METADATA)]

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


class IpcKernelManager(AsyncKernelManager):
    """nbclient's ``kernel_manager_class``: its kernels on IPC endpoints, as :class:`Kernel`'s."""

    def __init__(self, **kwargs: Any):
        super().__init__(**{**ipc_endpoints(), **kwargs})


class Kernel:
    """A started kernel and a blocking client, with a cell-level helper."""

    def __init__(self, name: str, **start_kwargs: Any):
        self.name = name
        # IPC endpoints, not TCP ports: two workers starting many kernels at once made a
        # port jupyter_client had chosen be taken before the proxy bound it (EADDRINUSE).
        self.km = local_manager(name, KernelManager)
        self.km.start_kernel(**start_kwargs)  # cwd, env, stdout, stderr: as jupyter_client takes them
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=180)
        #: Shell replies read while waiting for something else (msg_id -> reply).
        self.other_replies: dict[str, dict] = {}

    def execute(self, code: str, timeout: float = 120, allow_stdin: bool = False,
                stdin: Callable[[dict], str] | None = None, interrupt_after: float | None = None,
                stop_on_error: bool = True) -> Result:
        """Run one cell; collect IOPub until idle and the execute_reply.

        ``interrupt_after`` (seconds) counts from the cell's ``execute_input``, the kernel's
        word that the cell has started, as a user presses Stop on a cell they see running:
        never from the request, so an interrupt cannot reach a kernel that has not begun
        the cell yet however loaded the machine is (the cell would then run on uninterrupted).
        """
        t0 = time.monotonic()
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin, stop_on_error=stop_on_error)
        interrupted = interrupt_after is None
        started: float | None = None  # when execute_input arrived
        res = Result(reply={})
        idle = False
        deadline = t0 + timeout
        while not (idle and res.reply):
            if not interrupted and started is not None and time.monotonic() - started >= interrupt_after:
                self.km.interrupt_kernel()
                interrupted = True
                res.interrupt_s = time.monotonic() - t0
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
                    if m["msg_type"] == "execute_input" and started is None:
                        started = time.monotonic()
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

    def sandbox_info(self, timeout: float = 60) -> dict:
        """kernel_info's ``sandbox`` field (answered by the proxy: never wakes the sandbox).

        Other shell replies that arrive meanwhile are kept in :attr:`other_replies`
        (by their request's msg_id), not dropped.
        """
        msg_id = self.kc.kernel_info()
        deadline = time.monotonic() + timeout
        while True:
            r = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") == msg_id:
                return r["content"]["sandbox"]
            self.other_replies[r["parent_header"].get("msg_id")] = r

    def wait_state(self, want: str, timeout: float = 60) -> dict:
        """Poll :meth:`sandbox_info` until the sandbox is in state ``want``; return the info."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.sandbox_info()
            if info["state"] == want:
                return info
            assert time.monotonic() < deadline, f"sandbox state {info['state']!r}, wanted {want!r}: {info}"
            time.sleep(0.1)

    def shutdown(self) -> None:
        """Stop the channels and shut the kernel down; again: nothing."""
        if getattr(self, "_shut", False):
            return
        self._shut = True
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def control(k: Kernel, msg_type: str, content: dict | None = None, timeout: float = 120) -> dict:
    """Send one control request; its reply's content."""
    msg = k.kc.session.msg(msg_type, content or {})
    k.kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = k.kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no {msg_type} reply in {timeout} s") from None
        if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            assert r["msg_type"] == msg_type.replace("_request", "_reply")
            return r["content"]


class Shells:
    """A frontend using subshells over a kernel's channels."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.kc = kernel.kc

    def control(self, msg_type: str, content: dict | None = None, timeout: float = 60) -> dict:
        msg = self.kc.session.msg(msg_type, content or {})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            r = self.kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return r["content"]

    def send(self, code: str, subshell_id: str | None, stop_on_error: bool = True) -> str:
        msg = self.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                                      "user_expressions": {}, "allow_stdin": False,
                                                      "stop_on_error": stop_on_error})
        msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def replies(self, msg_ids: list[str], timeout: float = 120) -> list[dict]:
        got: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(msg_ids):
            r = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") in msg_ids:
                got[r["parent_header"]["msg_id"]] = r
        return [got[m] for m in msg_ids]

    def stdout(self, msg_id: str, timeout: float = 120) -> str:
        out, deadline = [], time.monotonic() + timeout
        while True:
            m = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout":
                out.append(m["content"]["text"])
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                return "".join(out).strip()

    def run(self, code: str, subshell_id: str | None = None) -> str:
        return self.stdout(self.send(code, subshell_id))
