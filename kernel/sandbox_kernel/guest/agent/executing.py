"""The cells the inner kernel has not finished, as the agent forwarded and saw them.

A copy (a rewind or a fork, :mod:`sandbox_kernel.snapshots`) is made its own by one
interrupt, then a reseed (the host's ``interrupt`` and ``reseed`` ops).  One interrupt is
not always enough to end the cell of before:

* the image may have been taken after the agent forwarded an ``execute_request`` and
  before ipykernel began it; ipykernel ignores SIGINT between requests, so the interrupt
  is lost and the cell then runs in the copy;
* the cell may ignore SIGINT for a while (``signal.SIG_IGN``, a section in C code) or catch
  one ``KeyboardInterrupt`` and go on.

Either way the copy's first request would wait behind a cell whose output nobody reads.
So from a copy's reseed the agent interrupts again, every :data:`INTERRUPT_EVERY_S` (its
warm-up and its loop, :class:`.core.Agent`), while a cell it forwarded before the copy has
not ended, :data:`INTERRUPTS_MAX` times at most.  A cell has ended at its ``execute_reply``
or at the ``idle`` status parented to it (ipykernel goes idle without a reply when its
handler fails).  Cells sent after the copy are never interrupted here.

Runs in the agent process only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

#: Seconds between two interrupts of a cell of before a copy (the first is the host's
#: ``interrupt`` op).
INTERRUPT_EVERY_S = 1.0
#: Interrupts sent at most to the cells of before one copy (a cell that catches every
#: ``KeyboardInterrupt`` is then left to run; the agent logs it).
INTERRUPTS_MAX = 30


def msg_type(header: bytes) -> str | None:
    """The ``msg_type`` of a message's header (JSON), or None if it has none."""
    try:
        kind = json.loads(header).get("msg_type")
    except (ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


class Executing:
    """The msg ids of the cells (``execute_request``) forwarded to the inner kernel and not
    ended, and of those the ones of before the last copy (:meth:`copied`).

    Parameters
    ----------
    interrupt : callable
        Sends SIGINT to the interpreter (the agent's ``interrupt`` op, which calls
        :meth:`interrupted`).
    warn : callable
        Logs a line to the host (``str``).
    """

    def __init__(self, interrupt: Callable[[], None], warn: Callable[[str], None]) -> None:
        self.ids: set[str] = set()
        self.of_before: set[str] = set()
        self._interrupt, self._warn = interrupt, warn
        self._interrupted_at = 0.0
        self._left = 0

    def sent(self, msg: dict) -> None:
        """A message the host sent on shell has been forwarded."""
        header = msg.get("header") or {}
        if header.get("msg_type") == "execute_request" and isinstance(header.get("msg_id"), str):
            self.ids.add(header["msg_id"])

    def seen(self, channel: str, parent_id: object, header: bytes, content: bytes) -> None:
        """A message of the inner kernel's (its parts as JSON bytes): a cell it ends is
        forgotten.  Cheap for every other message: only those parented to a cell are read."""
        if parent_id not in self.ids:
            return
        if channel == "shell" or (channel == "iopub" and b'"idle"' in content and msg_type(header) == "status"):
            self.ended(parent_id)

    def ended(self, msg_id: object) -> None:
        """The cell ``msg_id`` has ended (or the interpreter has)."""
        self.ids.discard(msg_id)
        self.of_before.discard(msg_id)

    def clear(self) -> None:
        """The interpreter ended: no cell runs."""
        self.ids.clear()
        self.of_before.clear()

    def copied(self) -> None:
        """This interpreter is a copy's (its reseed): the cells running are of before."""
        self.of_before = set(self.ids)
        self._left = INTERRUPTS_MAX

    def interrupted(self, now: float) -> None:
        """The interpreter was just sent SIGINT (at ``now``, ``time.monotonic``)."""
        self._interrupted_at = now

    def tick(self) -> None:
        """Interrupt a cell of before the copy still running :data:`INTERRUPT_EVERY_S` after
        the last interrupt, :data:`INTERRUPTS_MAX` times; then say it is left to run."""
        if not self.of_before or self._left < 0:
            return
        if self._left == 0:
            self._left = -1
            self._warn(f"a cell of before the copy still runs after {INTERRUPTS_MAX} interrupts: it is left "
                       "to run (the copy's cells wait behind it)")
        elif time.monotonic() - self._interrupted_at >= INTERRUPT_EVERY_S:
            self._left -= 1
            self._interrupt()
