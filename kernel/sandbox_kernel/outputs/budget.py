"""Per-cell output caps: bytes per cell and IOPub messages per second.

Pure bookkeeping, no I/O: the proxy makes one :class:`OutputBudget` per
``execute_request`` and asks it about every counted IOPub message of that cell
(:data:`COUNTED_IOPUB`).  What the user sees once a cap is reached is a prefix
of the output followed by one notice (:meth:`OutputBudget.notice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: IOPub types whose bytes count against the per-cell output cap.
COUNTED_IOPUB = frozenset({"stream", "display_data", "update_display_data", "execute_result"})


def output_size(obj: Any) -> int:
    """About ``len(str(content))`` (what the caps count, in characters) without
    building the string: string lengths plus a few characters of punctuation per
    item.  One step per item, not per byte: a 3 MB stream batch is two steps.

    Examples
    --------
    >>> content = {"name": "stdout", "text": "hi"}
    >>> output_size(content), len(str(content))
    (30, 32)
    """
    if isinstance(obj, str):
        return len(obj) + 2
    if isinstance(obj, dict):
        return 2 + sum(len(k) + 4 if isinstance(k, str) else len(str(k)) + 2 for k in obj) + \
            sum(output_size(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return 2 + sum(output_size(v) + 2 for v in obj)
    return len(str(obj))  # numbers, booleans, None


@dataclass
class OutputBudget:
    """What one cell may still send to the frontend.

    Parameters
    ----------
    max_bytes : int
        :attr:`Policy.max_output_bytes_per_cell`, characters of message content
        plus bytes of binary buffers.
    max_msgs_per_s : int
        :attr:`Policy.max_output_msgs_per_s`, counted in 1 s windows.
    """

    max_bytes: int
    max_msgs_per_s: int
    used_bytes: int = 0
    dropped_bytes: int = 0
    dropped_msgs: int = 0
    #: The byte cap was reached: everything later in the cell is dropped.
    capped: bool = False
    window_start: float = 0.0
    window_msgs: int = 0

    def admit(self, msg_type: str, content: dict, buffer_bytes: int, now: float) -> dict | None:
        """Decide on one counted IOPub message.

        Parameters
        ----------
        msg_type, content
            The message (``content`` is never modified).
        buffer_bytes : int
            Total size of its binary buffers, bytes.
        now : float
            ``time.monotonic()``, seconds.

        Returns
        -------
        dict or None
            The content to relay (a ``stream`` crossing the byte cap is cut to
            what remains), or None to drop the message.
        """
        size = output_size(content) + buffer_bytes
        if now - self.window_start >= 1.0:
            self.window_start, self.window_msgs = now, 0
        self.window_msgs += 1
        left = self.max_bytes - self.used_bytes
        if self.capped or self.window_msgs > self.max_msgs_per_s:
            self._drop(size)
            return None
        if size > left:
            self.capped = True
            text = content.get("text") if msg_type == "stream" else None
            if isinstance(text, str) and left > 0:
                keep = text[:max(0, left - (size - len(text)))]
                self.dropped_bytes += size - len(keep)
                self.used_bytes += len(keep)
                return {**content, "text": keep} if keep else None
            self._drop(size)
            return None
        self.used_bytes += size
        return content

    def _drop(self, size: int) -> None:
        self.dropped_bytes += size
        self.dropped_msgs += 1

    def notice(self) -> str | None:
        """The cell's one line about what was dropped, or None."""
        if not (self.dropped_bytes or self.dropped_msgs):
            return None
        return (f"output limit reached; dropped {self.dropped_bytes} bytes ({self.dropped_msgs} whole "
                f"messages). Limits: max_output_bytes_per_cell={self.max_bytes}, "
                f"max_output_msgs_per_s={self.max_msgs_per_s}.")
