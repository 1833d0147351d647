"""Running a whole notebook with nbclient, as ``sandbox-kernel run`` and the tests do.

:class:`NotebookRunner` is nbclient's ``NotebookClient`` with one change: it reads the
kernel's shell and IOPub channels in slices of :data:`POLL_SLICE_S`, not in one wait.

Why: on a loaded machine a reply can sit in the client's socket while the asyncio wait
for it is never woken (a zmq socket's wake-up is edge-triggered, and one can be lost).
pyzmq looks at the socket once more when a wait times out, so the message is found,
but only at nbclient's cell ``timeout``. Seen here under load with widget notebooks:
a cell whose outputs and ``idle`` had all arrived waited exactly 120 s for its
``execute_reply``, with the stock ipykernel as with the sandbox (nbclient#312 reports
the same). With slices, such a reply is read within :data:`POLL_SLICE_S`.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from nbclient import NotebookClient

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


class NotebookRunner(NotebookClient):
    """nbclient's ``NotebookClient``, reading its channels with :func:`poll_in_slices`.

    Takes the same arguments and traits as ``nbclient.NotebookClient``.
    """

    async def async_start_new_kernel_client(self) -> Any:
        """nbclient's, then the shell and IOPub channels polled in slices."""
        kc = await super().async_start_new_kernel_client()
        for channel in (kc.shell_channel, kc.iopub_channel):
            poll_in_slices(channel)
        return kc
