"""The proxy's bookkeeping of the cells it relays.

For each ``execute_request`` relayed to the sandbox the proxy keeps a
:class:`CellState`: the cell's output budget (``max_output_bytes_per_cell``,
``max_output_msgs_per_s``: :class:`~.outputs.budget.OutputBudget`), whether it
ran past ``cell_timeout_s`` (then it is interrupted, and restarted if it ignores
the interrupt for ``interrupt_grace_s``), and the sandbox's use when it began
(for its reply's ``sandbox_usage``, :func:`.usage.cell_usage`).  :class:`Cells`
also keeps what is told on the next cell (lifecycle notices), the parents of
recent requests (output that outlives its request keeps its cell's parent), the
last cell (an egress denial is shown on it) and the waiting line a cell shows
while its sandbox starts or wakes.

It reaches the kernel through :class:`~sandbox_kernel.kernel_face.KernelFace`.
All methods run on the proxy's main asyncio loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .aio import background
from .backends.base import Usage
from .errors import SandboxDied
from .inflight import Pending
from .outputs.budget import COUNTED_IOPUB, OutputBudget
from .sandbox_state import PROGRESS_METADATA, notice
from .usage import SandboxUsage, cell_usage

if TYPE_CHECKING:
    from .kernel_face import KernelFace
    from .relay import Relay

__all__ = ["PROGRESS_AFTER_S", "PROGRESS_EVERY_S", "CellState", "Cells", "error_line"]

log = logging.getLogger("sandbox_kernel")

#: Seconds a cell waits for its sandbox (start, wake, restore) before the wait is shown in it.
PROGRESS_AFTER_S = 0.5
#: Seconds between updates of that line.
PROGRESS_EVERY_S = 1.0
#: Parents of this many recent requests are kept, for IOPub that outlives its request.
RECENT_PARENTS = 256

_ANSI_RED = "\x1b[0;31m"
_ANSI_RESET = "\x1b[0m"


def error_line(ename: str, evalue: str) -> str:
    """The last traceback line of an error (``ename: evalue``, the name in red), as an
    ipykernel error's traceback ends."""
    return f"{_ANSI_RED}{ename}{_ANSI_RESET}: {evalue}"


@dataclass
class CellState:
    """The proxy's own bookkeeping of one running ``execute_request``."""

    budget: OutputBudget
    #: The cell ran past ``cell_timeout_s`` and was interrupted.
    timed_out: bool = False
    #: The sandbox's use when the cell was relayed (:func:`.usage.cell_usage`), and when.
    usage_before: Usage | None = None
    started: float = 0.0


class Cells:
    """The cells a proxy kernel relays, by the frontend's ``msg_id``.

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: its policy (caps, timeouts), its relay, what it sends the frontend.
    usage : SandboxUsage
        Reads the sandbox's use at each cell's start and end.

    Attributes
    ----------
    last_execute : dict or None
        The last ``execute_request`` relayed: egress attempts are attributed to its cell.
    """

    def __init__(self, kernel: KernelFace, usage: SandboxUsage):
        self.kernel = kernel
        self.usage = usage
        self.last_execute: dict[str, Any] | None = None
        #: msg_id -> what is tracked of a running cell (output budget, timeout).
        self._running: dict[str, CellState] = {}
        #: Lifecycle notices for the next cell (a wake, a restore, a setup that failed).
        self._notices: list[str] = []
        #: msg_id -> frontend request of recent requests, for IOPub that outlives its request.
        self._recent: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    @property
    def _relay(self) -> Relay:
        relay = self.kernel.relay
        assert relay is not None, "start_sandbox() makes the relay before requests come"
        return relay

    # ---- what the next cell is told --------------------------------------------------

    def note(self, text: str) -> None:
        """Keep ``text`` to show on the next cell (with ``lifecycle_notices``)."""
        self._notices.append(text)

    def forget(self, text: str) -> None:
        """Not show ``text`` after all (its cell said it); nothing if it is not kept."""
        with contextlib.suppress(ValueError):
            self._notices.remove(text)

    def take_notices(self) -> list[str]:
        """The notices kept since the last call, in order; forgotten here."""
        notes, self._notices = self._notices, []
        return notes

    async def ready_with_progress(self, parent: dict[str, Any]) -> str | None:
        """:meth:`KernelFace.ready`, showing in the waiting cell what it waits for while it waits.

        A wait longer than :data:`PROGRESS_AFTER_S` (a cold start, a restore, memory to
        restore into) shows a ``display_data`` line, ``sandbox-kernel: restoring the
        sandbox from its checkpoint… 3 s``, updated in place every :data:`PROGRESS_EVERY_S`
        (``update_display_data``, spec "Update Display Data") and cleared
        (``clear_output``) before the cell's own outputs and notices: JupyterLab shows
        it where the cell's output will appear, and nothing of it stays in the notebook.

        Raises
        ------
        SandboxKernelError
            As :meth:`KernelFace.ready`.
        """
        k = self.kernel
        task = asyncio.ensure_future(k.ready())
        display_id = None
        t0 = time.monotonic()
        try:
            await asyncio.wait({task}, timeout=PROGRESS_AFTER_S)
            while not task.done():
                text = notice(f"{self._relay.progress()}… {time.monotonic() - t0:.0f} s")
                msg_type = "update_display_data" if display_id else "display_data"
                display_id = display_id or uuid.uuid4().hex
                k.publish(msg_type, {"data": {"text/plain": text}, "metadata": {PROGRESS_METADATA: True},
                                     "transient": {"display_id": display_id}},
                          parent, topic="display_data")
                await asyncio.wait({task}, timeout=PROGRESS_EVERY_S)
            return task.result()
        finally:
            if not task.done():  # the request itself was cancelled
                task.cancel()
            if display_id is not None:
                k.publish("clear_output", {"wait": False}, parent)

    # ---- a cell's life -----------------------------------------------------------------

    def begin(self, parent: dict[str, Any]) -> None:
        """Track the ``execute_request`` ``parent``: its budget, the sandbox's use now (its
        peak reset).  Called before the request goes out: its first output may come at once."""
        policy = self.kernel.policy
        self.last_execute = parent
        self._running[str(parent["header"]["msg_id"])] = CellState(
            OutputBudget(policy.max_output_bytes_per_cell, policy.max_output_msgs_per_s),
            usage_before=self.usage.read(reset_peak=True), started=time.monotonic())

    def drop(self, msg_id: str) -> None:
        """Forget the cell ``msg_id`` (it got no reply: its sandbox died or went silent)."""
        self._running.pop(msg_id, None)

    def arm_timeout(self, p: Pending) -> asyncio.TimerHandle | None:
        """Interrupt the cell ``p`` once it ran ``cell_timeout_s`` (None: no limit); the
        caller cancels the returned timer when the reply came."""
        limit = self.kernel.policy.cell_timeout_s
        if not limit:
            return None

        def fire() -> None:
            background(self._on_timeout(p))

        return asyncio.get_running_loop().call_later(limit, fire)

    async def _on_timeout(self, p: Pending) -> None:
        cell = self._running.get(p.msg_id)
        if p.reply.done() or cell is None:
            return
        cell.timed_out = True
        policy = self.kernel.policy
        limit = policy.cell_timeout_s
        self.kernel.send_stderr(p.parent, notice(f"the cell ran longer than cell_timeout_s={limit:g} s and "
                                                 "was interrupted. Change it with --SandboxKernel.cell_timeout_s."))
        await self._relay.interrupt()
        await asyncio.sleep(policy.interrupt_grace_s)
        if not p.reply.done():
            reason = (f"the cell ignored the interrupt after cell_timeout_s={limit:g} s "
                      f"(+{policy.interrupt_grace_s:g} s grace)")
            self._relay.abandon(p, SandboxDied(reason))
            await self._relay.restart_interpreter(reason)

    def finish(self, p: Pending, content: dict[str, Any],
               metadata: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``execute_reply`` of the cell ``p``, finished: ``(content, metadata)``.

        The metadata gains ``sandbox_usage``, what the cell cost (:func:`.usage.cell_usage`);
        the cell's dropped output, a ``MemoryError`` and a timeout are told on its stderr,
        and a timed-out cell's error is renamed (:meth:`timeout_error`).  The cell is
        forgotten.
        """
        cell = self._running.get(p.msg_id)
        if cell is not None:  # what the cell cost, against the limits (.usage)
            metadata = {**metadata, "sandbox_usage": cell_usage(
                self.kernel.policy, cell.usage_before, self.usage.read(), time.monotonic() - cell.started)}
        try:
            content = self._finish(p, content)
        except Exception:  # a notice must never cost the user the reply
            log.exception("post-processing the execute_reply failed; relaying it unchanged")
        return content, metadata

    def _finish(self, p: Pending, content: dict[str, Any]) -> dict[str, Any]:
        cell = self._running.pop(p.msg_id, None)
        dropped = cell.budget.notice() if cell is not None else None
        if dropped:
            self.kernel.send_stderr(p.parent, notice(dropped))
        if content.get("ename") == "MemoryError":
            self.kernel.send_stderr(p.parent, notice(f"the sandbox's memory limit is "
                                                     f"{self.kernel.policy.memory_mib} MiB (memory_mib); the "
                                                     "interpreter and its state are intact."))
        if cell is not None and cell.timed_out and content.get("status") == "error":
            content.update(self.timeout_error(content))
        return content

    def timeout_error(self, content: dict[str, Any]) -> dict[str, Any]:
        """The inner ``KeyboardInterrupt`` of a timed-out cell, renamed so that the reply and
        the error output the notebook shows both name the timeout and how to change it.

        Returns
        -------
        dict
            ``ename``, ``evalue`` and ``traceback`` to lay over ``content``'s.
        """
        evalue = (f"cell exceeded cell_timeout_s={self.kernel.policy.cell_timeout_s:g} s and was "
                  "interrupted; state is kept. Change it with --SandboxKernel.cell_timeout_s.")
        tb = [*(content.get("traceback") or [])][:-1] if content.get("ename") == "KeyboardInterrupt" else \
            list(content.get("traceback") or [])
        tb.append(error_line("CellTimeoutError", evalue))
        return {"ename": "CellTimeoutError", "evalue": evalue, "traceback": tb}

    # ---- the cell's output -------------------------------------------------------------

    def parent_of(self, pending: Pending | None, parent_msg_id: str | None) -> dict[str, Any]:
        """The parent of an IOPub message from the sandbox: its request's, or, for output
        that arrives after its request finished (a thread started by the cell, a timer),
        that cell's, as with a stock ipykernel (an empty parent would orphan it in the
        frontend); ``{}`` if unknown."""
        recent = self._recent
        if pending is None:
            return recent.get(parent_msg_id or "", {})
        recent[pending.msg_id] = pending.parent
        recent.move_to_end(pending.msg_id)
        while len(recent) > RECENT_PARENTS:
            recent.popitem(last=False)
        return pending.parent

    def admit(self, pending: Pending | None, msg_type: str, content: dict[str, Any],
              buffers: list[bytes] | None) -> dict[str, Any] | None:
        """An IOPub message of a running cell through its output budget (a timed-out
        cell's ``error`` renamed first); the content to send, or None to drop it.

        Parameters
        ----------
        pending : Pending or None
            Its request; output of no running cell passes unchanged.
        msg_type : str
        content : dict
        buffers : list of bytes or None
            Its binary buffers (their bytes count).
        """
        cell = self._running.get(pending.msg_id) if pending is not None else None
        if msg_type == "error" and cell is not None and cell.timed_out:
            content = {**content, **self.timeout_error(content)}
        if cell is not None and msg_type in COUNTED_IOPUB:
            return cell.budget.admit(msg_type, content, sum(len(b) for b in buffers or ()), time.monotonic())
        return content

    def last_execute_id(self) -> str | None:
        """The ``msg_id`` of the last cell relayed; None before the first."""
        return self.last_execute["header"]["msg_id"] if self.last_execute else None

    def show_egress_denial(self, msg_id: str | None, line: str) -> None:
        """A refused egress attempt, on the stderr of the cell it is attributed to.

        Called by the backend's :class:`~.egress.record.EgressLog` (``observe``).
        """
        last = self.last_execute
        parent = last if last and last["header"]["msg_id"] == msg_id else self._recent.get(msg_id or "")
        if parent:
            self.kernel.send_stderr(parent, line)
