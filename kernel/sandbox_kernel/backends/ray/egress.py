"""Egress records of a Ray sandbox, from its node to the proxy (``network=allowlist``).

On the node the actor's :class:`~sandbox_kernel.backends.local.LocalBackend` runs the
local backend's own filtering proxy (:mod:`sandbox_kernel.egress.server`), which
records every attempt in its backend's ``egress_log``: there it is a
:class:`NodeEgressLog`, which attributes each attempt to the cell the proxy named
with its last write (:meth:`~.owner.SandboxOwner.write`) and keeps what changed
until the proxy's next read takes it (:meth:`NodeEgressLog.take`: the actor's
:meth:`~.owner.SandboxOwner.read` returns it beside the agent's bytes, and returns at
once when an attempt was recorded).  On the proxy the backend's ``egress_log`` is a
:class:`MirroredEgressLog`: :meth:`MirroredEgressLog.apply` adds the node's records
to ``kernel_info["sandbox"]["egress"]`` and shows each denial in its cell, as the
local backend's log does.  Since the actor returns a denial with (or before) the
first agent bytes read after it, the line reaches the cell before the cell's own
output that follows the refusal.

Neither side imports Ray; the records are plain dicts of JSON types.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from ...egress.record import RECENT, EgressAttempt, EgressLog
from ...egress.rules import Decision

log = logging.getLogger("sandbox_kernel.egress")

#: Records a node keeps for the proxy at most (the oldest go first; ``counts`` stay exact).
MAX_PENDING = 1000

_Key = tuple[float, str, int]


def _key(a: dict[str, Any]) -> _Key:
    return (float(a["time"]), str(a["host"]), int(a["port"]))


@dataclass
class NodeEgressLog(EgressLog):
    """The egress log of a sandbox's local backend on a Ray node; see the module docstring.

    Attributes
    ----------
    cell : str or None
        ``msg_id`` of the cell attempts are attributed to: the one the proxy named with
        its last write (the running or last cell, as locally).
    changed : asyncio.Event
        Set when a record waits for the proxy (:meth:`take` clears it).
    """

    cell: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _pending: collections.OrderedDict[_Key, tuple[dict[str, Any], str | None]] = field(
        default_factory=collections.OrderedDict, repr=False)

    def __post_init__(self) -> None:
        self.observe(lambda: self.cell, lambda cell, line: None)

    def record(self, decision: Decision, method: str = "CONNECT") -> EgressAttempt:
        """As :meth:`EgressLog.record` (called by the node's egress proxy), kept for the proxy
        with the denial's line."""
        a = super().record(decision, method)
        self._keep(a, None if decision.allowed else decision.line)
        return a

    def closed(self, a: EgressAttempt) -> None:
        """As :meth:`EgressLog.closed`; the attempt's final bytes are kept for the proxy."""
        super().closed(a)
        self._keep(a, None)

    def _keep(self, a: EgressAttempt, line: str | None) -> None:
        d = dataclasses.asdict(a)
        k = _key(d)
        old = self._pending.pop(k, None)
        self._pending[k] = (d, line if line is not None else old[1] if old else None)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)
        self.changed.set()

    def take(self) -> dict[str, Any] | None:
        """What changed since the last call, for the proxy: ``counts`` and ``attempts`` (each
        an attempt's fields and ``line``, its denial line or None); None when nothing did.
        Called by the actor's :meth:`~.owner.SandboxOwner.read`."""
        self.changed.clear()
        if not self._pending:
            return None
        attempts = [{**d, "line": line} for d, line in self._pending.values()]
        self._pending.clear()
        return {"counts": dict(self.counts), "attempts": attempts}


@dataclass
class MirroredEgressLog(EgressLog):
    """The proxy's copy of a Ray sandbox's egress log; see the module docstring.

    The kernel observes it as any backend's log (:meth:`EgressLog.observe`); the cell
    it names is sent to the node with each write (:meth:`EgressLog.current_cell`).
    """

    _by_key: dict[_Key, EgressAttempt] = field(default_factory=dict, repr=False)

    def apply(self, batch: dict[str, Any]) -> None:
        """Add the node's records (:meth:`NodeEgressLog.take`): new attempts to ``recent``,
        bytes to those already there, the node's ``counts``; each new denial is logged and
        shown in its cell.  Called by :meth:`.backend.RayBackend.read`."""
        names = {f.name for f in dataclasses.fields(EgressAttempt)}
        for rec in batch.get("attempts") or ():
            k = _key(rec)
            a = self._by_key.get(k)
            if a is not None:
                a.bytes_out, a.bytes_in, a.reason = int(rec["bytes_out"]), int(rec["bytes_in"]), str(rec["reason"])
                if not rec.get("line"):
                    self.closed(a)
                continue
            a = EgressAttempt(**{n: v for n, v in rec.items() if n in names})
            self.recent.append(a)
            self._by_key[k] = a
            if rec.get("line"):
                log.warning("%s (cell %s, %s, on the Ray node)", rec["line"], a.cell, a.method)
                try:
                    self._on_denied(a.cell, str(rec["line"]))
                except Exception:  # a notice must never break the proxy
                    log.exception("could not show an egress denial in its cell")
        if len(self._by_key) > 2 * RECENT:
            self._by_key = {(a.time, a.host, a.port): a for a in self.recent}
        self.counts.update({k: int(v) for k, v in (batch.get("counts") or {}).items() if k in self.counts})
