"""What the agent client tells of a kernel's sandbox (:class:`SandboxInfo`) and the shape of
its ``input()`` answerer (:data:`InputCallback`): shared by ``Sandbox`` and its verbs
(:mod:`.snapshots`), below both."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

#: ``on_input(prompt, password) -> str``: answers ``input()`` / ``getpass()`` in a cell.
InputCallback = Callable[[str, bool], "str | Awaitable[str]"]


@dataclass
class SandboxInfo:
    """Where the cells run, from ``kernel_info_reply["sandbox"]`` (answered by the proxy).

    Attributes
    ----------
    backend : str or None
        ``"local"``, ``"e2b"``, ``"modal"``; None for a kernel that is not a sandbox-kernel.
    boundary : str or None
        The isolation boundary in one phrase (``"gVisor user-space kernel ..."``).
    state : str or None
        The sandbox's state (``"running"``, ``"paused"``, ...).
    limits : dict[str, Any]
        The policy's limits with units in the names (``memory_mib``, ``cell_timeout_s``).
    egress : str or None
        The network policy: ``"none"`` (no network) or ``"allowlist"``.
    egress_detail : dict[str, Any]
        ``kernel_info_reply["sandbox"]["egress"]``: with an allowlist, its
        ``allow_domains``, ``allow_ports``, what the backend enforces, ``counts``
        and the ``recent`` attempts (time, cell ``msg_id``, host, port, bytes,
        verdict and reason).
    raw : dict[str, Any]
        The whole ``sandbox`` field (runtime, ids, idle plan, timings).
    """

    backend: str | None
    boundary: str | None
    state: str | None
    limits: dict[str, Any] = field(default_factory=dict)
    egress: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    egress_detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kernel_info(cls, content: dict[str, Any]) -> SandboxInfo:
        sb = content.get("sandbox") or {}
        egress = sb.get("egress")  # a dict since issue 17; a bare string before
        detail = dict(egress) if isinstance(egress, dict) else {"network": egress} if egress else {}
        return cls(backend=sb.get("backend"), boundary=sb.get("boundary"), state=sb.get("state"),
                   limits=dict(sb.get("limits") or {}), egress=detail.get("network"), raw=dict(sb),
                   egress_detail=detail)
