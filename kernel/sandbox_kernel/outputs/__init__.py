"""The output firewall: what a sandbox may send to the user's browser.

JupyterLab treats what a kernel sends in the current session as trusted: it
runs ``<script>`` in ``text/html``, executes ``application/javascript``,
renders raw HTML in markdown, typesets MathJax, builds widgets from their
state, and lets the page fetch every address in all of these.  Script in the
user's page can drive their Jupyter server (which opens unsandboxed
terminals); a fetch from it is a way out for data the sandbox, which has no
network, could not send itself.  Under the default policy (``sanitize``) the
proxy passes every message from the sandbox through :class:`OutputFirewall`
before re-signing it; under ``trust`` everything passes unchanged.

Every path, and what happens on it (docs/security.md has the full table):

* IOPub ``display_data``, ``update_display_data``, ``execute_result``; the
  ``page`` payloads of ``execute_reply``; ``inspect_reply`` data: each mime
  bundle entry by type (:mod:`.bundles`): text and inline images pass;
  ``text/html`` is sanitised with nh3 (:mod:`.html`); ``image/svg+xml`` is
  rebuilt from an allowlist (:mod:`.svg`); markdown and LaTeX are shown as
  plain text if anything in them is active (:mod:`.text`); Vega, Vega-Lite
  and Plotly charts are removed if they would fetch (:mod:`.specs`);
  JavaScript and every unknown type are removed.  Per-type metadata is cut to
  keys the renderers read for layout.
* ``comm_open``/``comm_msg`` from the sandbox, on comms either side opened:
  widget state is judged by the view that will draw it (:mod:`.widgets`),
  including the states the frontend asks for after a page reload
  (``update_states`` on the frontend-opened ``jupyter.widget.control`` comm)
  and ``Output`` widgets' outputs every time they are sent; messages of other
  targets pass only as inert JSON without buffers.
* Messages the frontend sends are recorded (comm targets, widget state the
  browser now holds), never altered.

Each removal is named once per output, in one ``stderr`` line that starts
with ``sandbox-kernel: removed``.  The firewall holds per-kernel state (comm
targets, widget states); it does no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .bundles import SAFE_TYPES, SCRIPT_TYPES, filter_bundle, filter_metadata, is_safe_type
from .common import inert_text, notice
from .html import describe_html_removals, sanitize_html
from .specs import PLOTLY_TYPE, VEGA_TYPES
from .svg import SvgError, sanitize_svg
from .text import latex_problems, markdown_problems
from .widgets import WidgetRegistry, put_buffers, remove_buffers

__all__ = [
    "OutputFirewall", "sanitize_html", "sanitize_svg", "SvgError", "markdown_problems", "latex_problems",
    "describe_html_removals", "is_safe_type", "SAFE_TYPES", "SCRIPT_TYPES", "VEGA_TYPES", "PLOTLY_TYPE",
    "BUNDLE_MSG_TYPES", "WIDGET_TARGET", "CONTROL_TARGET",
]

#: IOPub message types whose ``content["data"]`` is a mime bundle.
BUNDLE_MSG_TYPES = frozenset({"display_data", "update_display_data", "execute_result"})
WIDGET_TARGET = "jupyter.widget"
CONTROL_TARGET = "jupyter.widget.control"
_STATE_METHODS = frozenset({"update", "echo_update"})


class OutputFirewall:
    """Applies ``output_policy`` to everything the sandbox sends towards the browser.

    One per kernel: it remembers comm targets and widget states.

    Parameters
    ----------
    output_policy : {"sanitize", "trust"}
        :attr:`sandbox_kernel.policy.Policy.output_policy`.
    trusted_widget_modules : collection of str, optional
        Widget modules (e.g. ``"jupyter-matplotlib"``) whose views the operator
        trusts; their widgets are accepted and relayed unfiltered.
    trusted_comm_targets : collection of str, optional
        Comm targets whose messages the operator trusts.

    Raises
    ------
    ValueError
        For any other policy name.

    Examples
    --------
    >>> fw = OutputFirewall("sanitize")
    >>> content, notices = fw.filter("display_data", {"data": {
    ...     "application/javascript": "alert(1)", "text/plain": "x"}, "metadata": {}})
    >>> content["data"]
    {'text/plain': 'x'}
    """

    def __init__(self, output_policy: str = "sanitize", trusted_widget_modules: Collection[str] = (),
                 trusted_comm_targets: Collection[str] = ()):
        if output_policy not in ("sanitize", "trust"):
            raise ValueError(f"output_policy must be 'sanitize' or 'trust', not {output_policy!r}")
        self.trust = output_policy == "trust"
        self.trusted_comm_targets = frozenset(trusted_comm_targets)
        #: comm_id -> target name, for comms opened by either side.
        self._comms: dict[str, str] = {}
        self.widgets = WidgetRegistry(trusted_widget_modules, self._filter_outputs)

    # ---- mime bundles ---------------------------------------------------------------

    def _bundle(self, data: dict, metadata: Any = None) -> tuple[dict, Any, list[str]]:
        new_data, removed = filter_bundle(data, self.widgets.refused.__contains__)
        new_meta, meta_removed = filter_metadata(metadata, new_data, data) if metadata is not None \
            else (None, [])
        removed += meta_removed
        if new_data is not data and new_data == {"text/plain": ""}:
            new_data = {"text/plain": notice(removed)}
        return new_data, new_meta, removed

    def filter_bundle(self, data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Filter one mime bundle.

        Returns
        -------
        (dict, list of str)
            The bundle (the same object when nothing changed) and at most one notice.
        """
        if self.trust or not isinstance(data, dict):
            return data, []
        new, _, removed = self._bundle(data)
        return new, ([notice(removed)] if removed else [])

    def filter(self, msg_type: str, content: dict) -> tuple[dict, list[str]]:
        """Filter one IOPub message's content.

        Called by the proxy for every IOPub message from the sandbox before it
        is re-signed; ``display_data``, ``update_display_data`` and
        ``execute_result`` are examined, other types return unchanged (comm
        messages go to :meth:`filter_comm`).

        Parameters
        ----------
        msg_type : str
            ``header.msg_type`` of the message.
        content : dict
            Its ``content``; never modified in place.

        Returns
        -------
        (dict, list of str)
            The content to relay (the same object when nothing changed) and at
            most one notice naming everything removed from this output.  When
            nothing of the output is left, its ``text/plain`` is the notice.
        """
        if self.trust or msg_type not in BUNDLE_MSG_TYPES or not isinstance(content, dict):
            return content, []
        data = content.get("data")
        if not isinstance(data, dict):
            return content, []
        meta = content.get("metadata")
        new_data, new_meta, removed = self._bundle(data, meta)
        if new_data is data and new_meta is meta:
            return content, []
        out = {**content, "data": new_data}
        if new_meta is not None:
            out["metadata"] = new_meta
        return out, ([notice(removed)] if removed else [])

    def filter_payload(self, payload: list) -> tuple[list, list[str]]:
        """Filter ``execute_reply`` ``payload`` entries (spec, "Payloads (DEPRECATED)").

        Entries with ``source == "page"`` carry a mime bundle in ``data`` (shown
        by ``?`` and ``%page`` in the pager) and are filtered like display data;
        other entries (``set_next_input``, ``edit_magic``, ``ask_exit``) carry no
        markup and pass unchanged.

        Returns
        -------
        (list, list of str)
            The payload (the same object when nothing changed) and notices.
        """
        if self.trust or not isinstance(payload, list):
            return payload, []
        out, notices, changed = [], [], False
        for entry in payload:
            if isinstance(entry, dict) and entry.get("source") == "page" and isinstance(entry.get("data"), dict):
                new_data, n = self.filter_bundle(entry["data"])
                if new_data is not entry["data"]:
                    entry, changed = {**entry, "data": new_data}, True
                notices += n
            out.append(entry)
        return (out if changed else payload), notices

    def filter_reply(self, msg_type: str, content: dict) -> tuple[dict, list[str]]:
        """Filter a reply: ``inspect_reply`` data (shown in the tooltip and the
        contextual help panel), ``execute_reply`` page payloads and ``user_expressions``
        results, and ``debug_reply`` ``body.data`` (the debugger's rich variable view),
        each like a bundle.

        Returns
        -------
        (dict, list of str)
            The content (the same object when nothing changed) and notices.
        """
        if self.trust or not isinstance(content, dict):
            return content, []
        if msg_type == "inspect_reply" and isinstance(content.get("data"), dict):
            data, notes = self.filter_bundle(content["data"])
            return ({**content, "data": data} if data is not content["data"] else content), notes
        body = content.get("body")
        if msg_type == "debug_reply" and isinstance(body, dict) and isinstance(body.get("data"), dict):
            # richInspectVariables: a variable's mime bundle, rendered by the debugger panel
            data, notes = self.filter_bundle(body["data"])
            return ({**content, "body": {**body, "data": data}} if data is not body["data"] else content), notes
        if msg_type != "execute_reply":
            return content, []
        notes = []
        if content.get("payload"):
            payload, notes = self.filter_payload(content["payload"])
            if payload is not content["payload"]:
                content = {**content, "payload": payload}
        exprs = content.get("user_expressions")
        if isinstance(exprs, dict):  # each result a bundle (extensions render them in markdown cells)
            clean = {}
            for name, result in exprs.items():
                if isinstance(result, dict) and isinstance(result.get("data"), dict):
                    data, n = self.filter_bundle(result["data"])
                    result = {**result, "data": data} if data is not result["data"] else result
                    notes += n
                clean[name] = result
            if clean != exprs:
                content = {**content, "user_expressions": clean}
        return content, notes

    def _filter_outputs(self, outputs: list) -> tuple[list, list[str]]:
        """An ``Output`` widget's stored outputs (nbformat output dicts), like top-level outputs."""
        out, removed = [], []
        for o in outputs:
            if not isinstance(o, dict):
                continue
            kind = o.get("output_type")
            if kind in ("display_data", "execute_result", "update_display_data") and isinstance(o.get("data"), dict):
                data, meta, what = self._bundle(o["data"], o.get("metadata"))
                if data is not o["data"] or meta is not o.get("metadata"):
                    o = {**o, "data": data, **({"metadata": meta} if meta is not None else {})}
                removed += what
            elif kind not in ("stream", "error"):
                removed.append(f"an output of unknown type {kind!r}")
                continue
            out.append(o)
        return out, removed

    # ---- comms ---------------------------------------------------------------------

    def observe_frontend(self, msg_type: str, content: dict, buffers: list[bytes] | None = None) -> None:
        """Record a ``comm_open``/``comm_msg``/``comm_close`` the frontend sent.

        Called by the proxy for each comm message on the shell channel before
        it is relayed: the sandbox's answers on a comm the frontend opened are
        then filtered by that comm's target, and widget state the browser set
        is known.  Never alters the message.
        """
        comm_id = content.get("comm_id") if isinstance(content, dict) else None
        if not isinstance(comm_id, str):
            return
        if msg_type == "comm_open":
            self._comms.setdefault(comm_id, str(content.get("target_name")))
        elif msg_type == "comm_close":
            self._comms.pop(comm_id, None)
            self.widgets.forget(comm_id)
        data = content.get("data")
        if self._comms.get(comm_id) == WIDGET_TARGET and isinstance(data, dict) \
                and isinstance(data.get("state"), dict):
            self.widgets.observe(comm_id, put_buffers(data["state"], data.get("buffer_paths"), buffers or []))

    def filter_comm(self, msg_type: str, content: dict, buffers: list[bytes] | None = None
                    ) -> tuple[dict | None, list[bytes], list[str]]:
        """Filter a ``comm_open``/``comm_msg``/``comm_close`` from the sandbox (spec, "Custom Messages").

        Parameters
        ----------
        msg_type : str
            The message type.
        content : dict
            Its content; never modified in place.
        buffers : list of bytes, optional
            Its binary buffers.

        Returns
        -------
        (dict or None, list of bytes, list of str)
            The content to relay (None: drop the message), its buffers, and at
            most one notice.
        """
        buffers = list(buffers or [])
        comm_id = content.get("comm_id") if isinstance(content, dict) else None
        if not isinstance(comm_id, str):
            return (content if self.trust else None), buffers, []
        if msg_type == "comm_open":
            self._comms[comm_id] = str(content.get("target_name"))
        target = self._comms.get(comm_id)
        if msg_type == "comm_close":
            self._comms.pop(comm_id, None)
            self.widgets.forget(comm_id)
            return content, buffers, []
        if self.trust or target in self.trusted_comm_targets:
            return content, buffers, []
        removed: list[str] = []
        if content.get("target_module") is not None:  # JupyterLab would load it with requirejs
            content = {**content, "target_module": None}
            removed.append("a request to load code for a comm")
        data = content.get("data")
        if target == WIDGET_TARGET and isinstance(data, dict):
            content, buffers, what = self._widget_message(msg_type, comm_id, content, buffers)
        elif target == CONTROL_TARGET and isinstance(data, dict) and data.get("method") == "update_states":
            content, buffers, what = self._update_states(content, buffers)
        elif not buffers and _inert(data):
            what = []
        else:
            removed.append(f"a message for comm target {target or 'unknown'!r} that the kernel "
                           "cannot tell is inert")
            return None, buffers, [notice(removed, "a widget message")]
        removed += what
        return content, buffers, ([notice(removed, "a widget message")] if removed else [])

    def _widget_message(self, msg_type, comm_id, content, buffers):
        data = content["data"]
        if msg_type == "comm_msg" and data.get("method") not in _STATE_METHODS:
            if comm_id in self.widgets.refused:
                return None, [], []
            return content, buffers, []  # "custom": core views act on none but focus/blur
        if not isinstance(data.get("state"), dict):
            return None, [], ["a widget message without a state"]
        state = put_buffers(data["state"], data.get("buffer_paths"), buffers)
        new_state, removed = self.widgets.apply(comm_id, state)
        if new_state is None:
            return None, [], removed
        clean, paths, bufs = remove_buffers(new_state)
        return {**content, "data": {**data, "state": clean, "buffer_paths": paths}}, bufs, removed

    def _update_states(self, content, buffers):
        """The frontend's ``request_states`` answer: every widget's full state, by model id."""
        data = content["data"]
        states = data.get("states")
        if not isinstance(states, dict):
            return None, [], ["a malformed widget state list"]
        by_id: dict[str, tuple[list, list]] = {}
        for path, buf in zip(data.get("buffer_paths") or [], buffers):
            if isinstance(path, list) and len(path) > 2 and path[1] == "state":
                paths, bufs = by_id.setdefault(str(path[0]), ([], []))
                paths.append(path[2:])
                bufs.append(buf)
        out_states, removed = {}, []
        for model_id, entry in states.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
                continue
            paths, bufs = by_id.get(str(model_id), ([], []))
            state = put_buffers(entry["state"], paths, bufs)
            if entry.get("model_name") is not None:  # the frontend creates the model from these
                state = {**state, "_model_name": entry["model_name"], "_model_module": entry.get("model_module")}
            new_state, what = self.widgets.apply(str(model_id), state)
            removed += what
            if new_state is None:
                continue
            full = dict(self.widgets.widgets[str(model_id)].state)
            out_states[model_id] = {**entry, "model_name": full.get("_model_name"),
                                    "model_module": full.get("_model_module"), "state": full}
        clean, paths, bufs = remove_buffers(out_states)  # paths start [model_id, "state", ...]
        return {**content, "data": {**data, "states": clean, "buffer_paths": paths}}, bufs, removed


def _inert(data: Any, depth: int = 0) -> bool:
    """True if ``data`` is JSON whose every string is :func:`inert_text`."""
    if depth > 100:
        return False
    if isinstance(data, str):
        return inert_text(data)
    if isinstance(data, dict):
        return all(isinstance(k, str) and inert_text(k) and _inert(v, depth + 1) for k, v in data.items())
    if isinstance(data, list):
        return all(_inert(v, depth + 1) for v in data)
    return data is None or isinstance(data, (int, float, bool))
