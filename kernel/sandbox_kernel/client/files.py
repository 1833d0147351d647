"""File transfer through the kernel's file comm (``sandbox_kernel.files``): the one call site.

Every file verb of the client and of the MCP server comes through
:class:`FileComm`.  The comm itself is the files issue (issue 12): until it
lands these raise :class:`NotImplementedError` naming it.  There is no
fallback that runs base64 code in the user's namespace: such code would be
cell code the user did not write, and its output would fill the cell's budget.
"""

from __future__ import annotations

from typing import Any

#: The comm target the proxy will answer (issue 12).
FILES_COMM_TARGET = "sandbox_kernel.files"

NOT_YET = ("needs the kernel's file comm ({target}, issue 12), which this version does not have yet; "
           "no code-execution fallback is used")


class FileComm:
    """Upload, download and list files in the sandbox through the file comm.

    Parameters
    ----------
    sandbox : AsyncSandbox
        The client whose kernel answers the comm (``comm_open`` to
        :data:`FILES_COMM_TARGET`).

    Raises
    ------
    NotImplementedError
        From every method until the file comm (issue 12) is wired here.
    """

    def __init__(self, sandbox: Any):
        self.sandbox = sandbox

    def _missing(self, verb: str) -> NotImplementedError:
        return NotImplementedError(f"{verb} " + NOT_YET.format(target=FILES_COMM_TARGET))

    async def upload(self, data: bytes, dest: str) -> None:
        """Write ``data`` (bytes) to ``dest`` in the sandbox."""
        raise self._missing("upload")

    async def download(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of ``path`` in the sandbox (at most ``max_bytes``)."""
        raise self._missing("download")

    async def list_files(self, path: str) -> list[dict[str, Any]]:
        """Entries of the directory ``path``: ``name``, ``type``, ``size`` (bytes)."""
        raise self._missing("list_files")
