"""What a cell produced, as plain objects: :class:`Execution`, :class:`Result`, :class:`ExecutionError`.

:class:`Collector` turns the Jupyter messages of one ``execute_request`` into
an :class:`Execution` (a dispatch table keyed on ``msg_type``; the messaging
spec's "IOPub" section).  Pure: no I/O, no kernel.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..sandbox_state import PROGRESS_METADATA

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colour codes of IPython tracebacks).

    >>> strip_ansi("\\x1b[0;31mZeroDivisionError\\x1b[0m: division by zero")
    'ZeroDivisionError: division by zero'
    """
    return _ANSI.sub("", text)


def _text_of(value: Any) -> str | None:
    """A MIME bundle value as one string (the spec allows a list of lines)."""
    if value is None:
        return None
    return "".join(value) if isinstance(value, list) else str(value)


def _binary(value: Any) -> bytes | None:
    """A base64 MIME value (``image/png``, ``image/jpeg``) decoded; None if absent or not base64."""
    text = _text_of(value)
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError):
        return None


@dataclass
class Result:
    """One rich output: an ``execute_result`` or a ``display_data`` MIME bundle.

    Attributes
    ----------
    data : dict[str, Any]
        The bundle, MIME type -> value as the kernel sent it (images base64).
    metadata : dict[str, Any]
        The bundle's metadata (image sizes, ...).
    is_main_result : bool
        True for the cell's ``execute_result`` (its last expression's value),
        False for ``display_data`` (``display()``, figures).
    """

    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    is_main_result: bool = False

    def __getitem__(self, mime: str) -> Any:
        return self.data[mime]

    @property
    def formats(self) -> list[str]:
        """The MIME types present, in the kernel's order."""
        return list(self.data)

    @property
    def text(self) -> str | None:
        """``text/plain``, or None."""
        return _text_of(self.data.get("text/plain"))

    @property
    def html(self) -> str | None:
        """``text/html``, or None."""
        return _text_of(self.data.get("text/html"))

    @property
    def markdown(self) -> str | None:
        """``text/markdown``, or None."""
        return _text_of(self.data.get("text/markdown"))

    @property
    def latex(self) -> str | None:
        """``text/latex``, or None."""
        return _text_of(self.data.get("text/latex"))

    @property
    def svg(self) -> str | None:
        """``image/svg+xml``, or None."""
        return _text_of(self.data.get("image/svg+xml"))

    @property
    def png(self) -> bytes | None:
        """``image/png`` decoded from base64 (the file's bytes), or None."""
        return _binary(self.data.get("image/png"))

    @property
    def jpeg(self) -> bytes | None:
        """``image/jpeg`` decoded from base64 (the file's bytes), or None."""
        return _binary(self.data.get("image/jpeg"))

    @property
    def json(self) -> Any:
        """``application/json`` (already parsed by the protocol), or None."""
        return self.data.get("application/json")

    def __repr__(self) -> str:
        return f"Result(formats={self.formats}, text={(self.text or '')[:60]!r})"


@dataclass
class ExecutionError:
    """A cell's error.

    Attributes
    ----------
    ename : str
        The exception's class name (``"ZeroDivisionError"``); ``"TimeoutError"``
        when the client interrupted the cell after ``run(timeout=...)``.
    evalue : str
        The exception's message.
    traceback : list[str]
        The traceback lines without ANSI colour codes.
    traceback_ansi : list[str]
        The same lines as the kernel sent them (ANSI colours kept).
    timed_out : bool
        True when the client interrupted the cell because its timeout passed
        (the kernel and its state were kept).
    """

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)
    traceback_ansi: list[str] = field(default_factory=list)
    timed_out: bool = False

    @classmethod
    def from_content(cls, content: dict[str, Any]) -> ExecutionError:
        """From an ``error`` IOPub message's or an error ``execute_reply``'s content."""
        tb = [str(line) for line in content.get("traceback") or []]
        return cls(ename=str(content.get("ename", "")), evalue=str(content.get("evalue", "")),
                   traceback=[strip_ansi(line) for line in tb], traceback_ansi=tb)

    def __str__(self) -> str:
        return f"{self.ename}: {self.evalue}"


@dataclass
class Execution:
    """Everything one cell produced.

    Attributes
    ----------
    stdout, stderr : str
        The streams, concatenated in arrival order.
    results : list[Result]
        ``execute_result`` and ``display_data`` bundles, in arrival order.
    error : ExecutionError or None
        The cell's error, or None if it succeeded.
    execution_count : int or None
        The kernel's counter for this cell (``In [n]``).
    duration_s : float
        Seconds from sending the request to the reply and the kernel's idle.
    usage : dict
        What the cell cost the sandbox, from its ``execute_reply`` metadata
        ``sandbox_usage`` (``cpu_s``, ``cpu_percent``, ``memory_bytes``, ``memory_peak_bytes``,
        ``wall_s`` beside ``memory_limit_bytes`` and ``cpu_cores``; ``measured`` False where
        the backend cannot read them; docs/agents.md); empty from a kernel that sends none.
    done : bool
        False while the cell runs (a partial :class:`Execution` seen through a handle).
    """

    stdout: str = ""
    stderr: str = ""
    results: list[Result] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    duration_s: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    @property
    def text(self) -> str | None:
        """The main result's ``text/plain`` (the cell's last expression), or None."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def ok(self) -> bool:
        """True if the cell finished without an error."""
        return self.done and self.error is None


Callback = Callable[[Any], Any]


class Collector:
    """Applies one cell's messages to its :class:`Execution`.

    Parameters
    ----------
    execution : Execution
        Filled in place (a handle may read it while the cell runs).
    on_stdout, on_stderr : callable(str), optional
        Called with each stream chunk as it arrives.
    on_result : callable(Result), optional
        Called with each rich output as it arrives.

    Returns of the callbacks are kept in :attr:`pending` (awaitables an async
    caller awaits); unknown IOPub types are ignored.
    """

    def __init__(self, execution: Execution, on_stdout: Callback | None = None,
                 on_stderr: Callback | None = None, on_result: Callback | None = None):
        self.execution = execution
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result}
        self.pending: list[Any] = []
        self.idle = False
        self._display_ids: dict[str, list[int]] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "stream": self._stream,
            "execute_result": self._result,
            "display_data": self._result,
            "update_display_data": self._update,
            "clear_output": self._clear,
            "error": self._error,
            "execute_input": self._input,
            "status": self._status,
        }

    def apply(self, msg: dict[str, Any]) -> None:
        """Take one IOPub message of this cell."""
        handler = self._handlers.get(msg.get("msg_type", ""))
        if handler is not None:
            handler(msg.get("content") or {})

    def apply_reply(self, content: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
        """Take the ``execute_reply``: the count, what the cell cost (``metadata``'s
        ``sandbox_usage``) and, for an error without an IOPub ``error`` (a proxy's own
        refusal), the error."""
        usage = (metadata or {}).get("sandbox_usage")
        if isinstance(usage, dict):
            self.execution.usage = dict(usage)
        count = content.get("execution_count")
        if isinstance(count, int):
            self.execution.execution_count = count
        if content.get("status") == "error" and self.execution.error is None:
            self.execution.error = ExecutionError.from_content(content)
        elif content.get("status") == "aborted" and self.execution.error is None:
            self.execution.error = ExecutionError("ExecutionAborted", "the kernel aborted this cell "
                                                  "(an earlier queued cell failed)")

    def _call(self, which: str, value: Any) -> None:
        cb = self.callbacks[which]
        if cb is not None:
            out = cb(value)
            if out is not None:
                self.pending.append(out)

    def _stream(self, c: dict[str, Any]) -> None:
        name, text = c.get("name"), str(c.get("text", ""))
        if name == "stderr":
            self.execution.stderr += text
            self._call("stderr", text)
        else:
            self.execution.stdout += text
            self._call("stdout", text)

    def _result(self, c: dict[str, Any]) -> None:
        if (c.get("metadata") or {}).get(PROGRESS_METADATA):
            return  # the kernel's "waiting for the sandbox" line, cleared before the cell's output
        count = c.get("execution_count")
        main = count is not None
        if main and isinstance(count, int):
            self.execution.execution_count = count
        r = Result(data=dict(c.get("data") or {}), metadata=dict(c.get("metadata") or {}),
                   is_main_result=main)
        display_id = (c.get("transient") or {}).get("display_id")
        if display_id:
            self._display_ids.setdefault(display_id, []).append(len(self.execution.results))
        self.execution.results.append(r)
        self._call("result", r)

    def _update(self, c: dict[str, Any]) -> None:
        if (c.get("metadata") or {}).get(PROGRESS_METADATA):
            return
        display_id = (c.get("transient") or {}).get("display_id")
        for i in self._display_ids.get(display_id or "", []):
            self.execution.results[i] = Result(data=dict(c.get("data") or {}),
                                               metadata=dict(c.get("metadata") or {}))

    def _clear(self, c: dict[str, Any]) -> None:
        self.execution.stdout = self.execution.stderr = ""
        self.execution.results.clear()
        self._display_ids.clear()

    def _error(self, c: dict[str, Any]) -> None:
        err = ExecutionError.from_content(c)
        timed_out = self.execution.error
        if timed_out is not None and timed_out.timed_out:
            # the client's interrupt after run(timeout=...): say so, keep the kernel's traceback
            timed_out.traceback, timed_out.traceback_ansi = err.traceback, err.traceback_ansi
        else:
            self.execution.error = err

    def _input(self, c: dict[str, Any]) -> None:
        count = c.get("execution_count")
        if isinstance(count, int):
            self.execution.execution_count = count

    def _status(self, c: dict[str, Any]) -> None:
        if c.get("execution_state") == "idle":
            self.idle = True
