"""Fire-and-forget tasks that are not lost.

The event loop keeps only weak references to tasks: a task nobody holds may be
garbage-collected before it finishes (asyncio's documentation of
``create_task``).  :func:`background` keeps each one until it is done and logs
an exception nobody else will see.
"""

from __future__ import annotations

import asyncio
import logging
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
