"""Fire-and-forget tasks that are not lost.

The event loop keeps only weak references to tasks: a task nobody holds may be
garbage-collected before it finishes (asyncio's documentation of
``create_task``).  :func:`background` keeps each one until it is done and logs
an exception nobody else will see.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("sandbox_kernel")

_RUNNING: set[asyncio.Future] = set()


def background(coro: Coroutine[Any, Any, Any]) -> asyncio.Future:
    """Run ``coro`` on the running loop without awaiting it; return its task.

    The task is held until it ends; an exception it ends with is logged
    (cancellation is not).
    """
    task = asyncio.ensure_future(coro)
    _RUNNING.add(task)
    task.add_done_callback(_done)
    return task


def _done(task: asyncio.Future) -> None:
    _RUNNING.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("a background task failed", exc_info=task.exception())


class InHand:
    """How many messages are being handled, counted from any thread.

    ``with in_hand:`` around a handler; :meth:`drained` waits until at most ``leave``
    remain (the caller's own handler, when it is one of them).
    """

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def __enter__(self) -> InHand:
        with self._lock:
            self._n += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._n -= 1

    def __len__(self) -> int:
        return self._n

    async def drained(self, timeout_s: float, *, leave: int = 0) -> bool:
        """Wait until at most ``leave`` handlers are in hand; False after ``timeout_s``
        seconds with more still running."""
        deadline = time.monotonic() + timeout_s
        while self._n > leave:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True
