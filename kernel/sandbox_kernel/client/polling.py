"""Reading a jupyter_client asyncio channel in slices, so a lost wake-up costs half a second.

On a loaded machine a message can sit in the client's zmq socket while the asyncio wait
for it is never woken (a zmq socket's wake-up is edge-triggered, and one can be lost).
pyzmq looks at the socket once more when a wait times out, so the message is found, but
only then: at nbclient's cell ``timeout`` (seen here: 120 s stalls of widget notebooks,
with the stock ipykernel too), or never for a wait without one. Waiting in slices of
:data:`POLL_SLICE_S` bounds that to one slice. Used by the agent client's readers
(:mod:`.transport`) and by ``sandbox-kernel run`` (:mod:`sandbox_kernel.nbrun`).
"""

from __future__ import annotations

import queue
import time
from typing import Any

#: Longest single wait on a channel, s: a lost wake-up costs at most this much.
POLL_SLICE_S = 0.5


def poll_in_slices(channel: Any, slice_s: float = POLL_SLICE_S) -> None:
    """Make ``channel.get_msg(timeout=...)`` wait in slices of ``slice_s`` seconds.

    Parameters
    ----------
    channel : jupyter_client.channels.AsyncZMQSocketChannel
        A started channel of an asyncio kernel client; its ``get_msg`` is replaced on
        this object only.
    slice_s : float
        Seconds of one wait.

    Notes
    -----
    The replacement keeps ``get_msg``'s contract: the message, or ``queue.Empty`` once
    ``timeout`` seconds have passed (``None``: wait for ever).
    """
    get = channel.get_msg

    async def get_msg(timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109 (get_msg's own signature)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = slice_s if deadline is None else max(0.0, min(slice_s, deadline - time.monotonic()))
            try:
                return await get(timeout=left)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = get_msg
