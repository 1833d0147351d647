"""The agent client: ``Sandbox`` / ``AsyncSandbox``, one call per cell, over ``jupyter_client``.

Host side and unprivileged: a client of the kernel like any frontend (it
speaks the Jupyter protocol, never the in-sandbox agent's).  It imports
nothing of the proxy (``proxy``, ``relay``, ``backends``).
"""

from .execution import Execution, ExecutionError, Result
from .files import FILES_COMM_TARGET, FileComm
from .sandbox import DEFAULT_KERNEL, AsyncSandbox, CellJob, Sandbox, SandboxInfo
from .snapshots import Snapshot, SnapshotError

__all__ = ["AsyncSandbox", "CellJob", "DEFAULT_KERNEL", "Execution", "ExecutionError", "FILES_COMM_TARGET",
           "FileComm", "Result", "Sandbox", "SandboxInfo", "Snapshot", "SnapshotError"]
