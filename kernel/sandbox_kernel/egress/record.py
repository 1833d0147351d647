"""Every egress attempt, recorded: for the cell that made it, the log and ``kernel_info``.

The proxy kernel tells the log which cell is running (:meth:`EgressLog.observe`);
each attempt is attributed to it (a connection made by a thread after its cell
ended counts for the last cell).  A denial reaches the kernel at once, which
prints :attr:`~.rules.Decision.line` on that cell's stderr.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .rules import Decision

log = logging.getLogger("sandbox_kernel.egress")

#: Attempts kept for ``kernel_info["sandbox"]["egress"]["recent"]``.
RECENT = 100


@dataclass
class EgressAttempt:
    """One connection the sandbox asked for.

    Attributes
    ----------
    time : float
        When it was asked, seconds since the epoch.
    cell : str or None
        ``msg_id`` of the cell it is attributed to; None before any cell ran.
    host : str
    port : int
    verdict : {"allowed", "denied"}
    reason : str
        The rule (denied) or how the address was found (allowed).
    method : str
        ``"CONNECT"`` or the HTTP method of an absolute-URI request.
    address : str
        ``ip:port`` connected to; empty when denied.
    bytes_out, bytes_in : int
        Bytes sent to, and received from, the remote side; updated while the
        connection lives.
    """

    time: float
    cell: str | None
    host: str
    port: int
    verdict: str
    reason: str
    method: str = "CONNECT"
    address: str = ""
    bytes_out: int = 0
    bytes_in: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "time": round(self.time, 3)}


@dataclass
class _CellUse:
    connections: int = 0
    bytes: int = 0


@dataclass
class EgressLog:
    """The recent attempts of one kernel, and who to tell.

    Attributes
    ----------
    recent : collections.deque of EgressAttempt
        The last :data:`RECENT` attempts, oldest first.
    counts : dict of str to int
        ``allowed`` and ``denied`` since the kernel started.
    """

    recent: collections.deque[EgressAttempt] = field(default_factory=lambda: collections.deque(maxlen=RECENT))
    counts: dict[str, int] = field(default_factory=lambda: {"allowed": 0, "denied": 0})
    _cell_of: Callable[[], str | None] = field(default=lambda: None, repr=False)
    _on_denied: Callable[[str | None, str], None] = field(default=lambda cell, line: None, repr=False)
    _use: collections.OrderedDict[str | None, _CellUse] = field(default_factory=collections.OrderedDict,
                                                                repr=False)

    def observe(self, cell_of: Callable[[], str | None], on_denied: Callable[[str | None, str], None]) -> None:
        """Called once by the proxy kernel: ``cell_of()`` names the running (or last)
        cell's ``msg_id``; ``on_denied(msg_id, line)`` shows a denial in that cell."""
        self._cell_of, self._on_denied = cell_of, on_denied

    def current_cell(self) -> str | None:
        """``msg_id`` of the cell attempts are attributed to now (the running or last one)."""
        return self._cell_of()

    def use(self, cell: str | None) -> _CellUse:
        """Connections and bytes cell ``cell`` used so far (the caps' counters)."""
        u = self._use.get(cell)
        if u is None:
            u = self._use[cell] = _CellUse()
            while len(self._use) > 64:
                self._use.popitem(last=False)
        return u

    def record(self, decision: Decision, method: str = "CONNECT") -> EgressAttempt:
        """Record a decision, attributed to the current cell; tell the kernel of a denial.

        Returns
        -------
        EgressAttempt
            Kept by the caller to add the bytes moved (:meth:`closed` when done).
        """
        cell = self._cell_of()
        a = EgressAttempt(time.time(), cell, decision.host, decision.port,
                          "allowed" if decision.allowed else "denied", decision.reason, method,
                          f"{decision.address[0]}:{decision.address[1]}" if decision.address else "")
        self.recent.append(a)
        self.counts[a.verdict] += 1
        self.use(cell).connections += 1
        if not decision.allowed:
            log.warning("%s (cell %s, %s)", decision.line, cell, method)
            try:
                self._on_denied(cell, decision.line)
            except Exception:  # a notice must never break the proxy
                log.exception("could not show an egress denial in its cell")
        return a

    def closed(self, a: EgressAttempt) -> None:
        """An allowed connection ended: log it with its bytes."""
        log.info("egress %s:%d via %s (cell %s): %d bytes out, %d in", a.host, a.port, a.address, a.cell,
                 a.bytes_out, a.bytes_in)

    def describe(self) -> dict[str, Any]:
        """``counts`` and ``recent`` (newest last) for ``kernel_info``."""
        return {"counts": dict(self.counts), "recent": [a.as_dict() for a in self.recent]}
