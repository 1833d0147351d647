"""Running a whole notebook with nbclient, as ``sandbox-kernel run`` and the tests do.

:class:`NotebookRunner` is nbclient's ``NotebookClient`` with one change: it reads the
kernel's shell and IOPub channels in slices (:func:`.client.polling.poll_in_slices`, which
says why), not in one wait. Without it, under load, a widget notebook's cell whose outputs
and ``idle`` had all come waited exactly nbclient's cell ``timeout`` (120 s) for its
``execute_reply``, with the stock ipykernel as with the sandbox (nbclient#312).
"""

from __future__ import annotations

from typing import Any

from nbclient import NotebookClient

from .client.polling import poll_in_slices


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
