"""Widget state from the sandbox, judged by the code that will draw it.

The frontend builds a widget's model from ``_model_module``/``_model_name``
and draws it with the view named by ``_view_module``/``_view_name``
(``packages/base-manager/src/manager-base.ts``); the *view* decides whether a
field lands in ``innerHTML``, is typeset by MathJax, becomes CSS or an image
address.  So a widget is accepted only when its (model module, model name,
view module, view name) is one of ipywidgets 8's own pairs
(:data:`KNOWN_WIDGETS`) or its modules were allowed by the operator, and every
field is filtered by the kind the accepted views give it (:func:`field_kind`),
read from ipywidgets 8.1's ``packages/controls/src``:

* HTML: ``value`` of ``HTMLView``/``HTMLMathView`` (``innerHTML``); ``description``
  when ``description_allow_html`` (``inline_sanitize`` keeps ``<img src>`` and
  ``style``).  Sanitised like ``text/html``.
* math: ``description`` (always typeset), ``value`` of ``LabelView``.  Active
  MathJax commands shown as text.
* CSS: every field of a style or layout model (``style.setProperty``), the
  colours of ``ColorsInput``.  Emptied if it could load anything.
* address: ``value`` of ``Image``/``Video``/``Audio`` with ``format='url'``
  (decoded and used as ``src``).  Emptied.
* media: ``format`` and (other formats) ``value`` of ``Image``/``Video``/``Audio``
  (a ``blob:`` URL of type ``image/<format>``, at the page's origin).  Judged
  together by what the bytes are (:mod:`.media`), whenever either is sent.
* outputs: ``outputs`` of ``OutputModel`` (rendered as trusted outputs).
  Filtered like top-level outputs, every time they are sent.

Everything else (option labels, titles, tooltips, placeholders) is set as text
by the views.  Links made in the browser (``jslink``) copy values between
widgets without the kernel, so a link may only write fields that are plain text
on its target, and such a field keeps that kind while the link lives.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .common import css_loads, math_active, neutralize_math
from .html import clean_html
from .media import judge_media

CONTROLS, BASE, OUTPUT = "@jupyter-widgets/controls", "@jupyter-widgets/base", "@jupyter-widgets/output"

_CONTROL_VIEWS = {
    "Accordion": "Accordion", "Audio": "Audio", "BoundedFloatText": "FloatText", "BoundedIntText": "IntText",
    "Box": "Box", "Button": "Button", "Checkbox": "Checkbox", "ColorPicker": "ColorPicker",
    "ColorsInput": "ColorsInput", "Combobox": "Combobox", "ControllerAxis": "ControllerAxis",
    "ControllerButton": "ControllerButton", "Controller": "Controller", "DatePicker": "DatePicker",
    "Datetime": "Datetime", "NaiveDatetime": "Datetime", "Dropdown": "Dropdown", "FileUpload": "FileUpload",
    "FloatLogSlider": "FloatLogSlider", "FloatProgress": "Progress", "FloatRangeSlider": "FloatRangeSlider",
    "FloatSlider": "FloatSlider", "FloatText": "FloatText", "FloatsInput": "FloatsInput", "GridBox": "GridBox",
    "HBox": "HBox", "HTMLMath": "HTMLMath", "HTML": "HTML", "Image": "Image", "IntProgress": "Progress",
    "IntRangeSlider": "IntRangeSlider", "IntSlider": "IntSlider", "IntText": "IntText",
    "IntsInput": "IntsInput", "Label": "Label", "Password": "Password", "Play": "Play",
    "RadioButtons": "RadioButtons", "Select": "Select", "SelectMultiple": "SelectMultiple",
    "SelectionRangeSlider": "SelectionRangeSlider", "SelectionSlider": "SelectionSlider", "Stack": "Stack",
    "Tab": "Tab", "TagsInput": "TagsInput", "Text": "Text", "Textarea": "Textarea", "Time": "Time",
    "ToggleButton": "ToggleButton", "ToggleButtons": "ToggleButtons", "VBox": "VBox", "Valid": "Valid",
    "Video": "Video",
}
STYLE_MODELS = frozenset({
    "StyleModel", "ButtonStyleModel", "CheckboxStyleModel", "DescriptionStyleModel", "HTMLMathStyleModel",
    "HTMLStyleModel", "LabelStyleModel", "ProgressStyleModel", "SliderStyleModel", "StringStyleModel",
    "TextStyleModel", "ToggleButtonStyleModel", "ToggleButtonsStyleModel", "LayoutModel",
})
#: The (model module, model name, view module, view name) pairs of ipywidgets 8.1.
KNOWN_WIDGETS = frozenset(
    {(CONTROLS, f"{m}Model", CONTROLS, f"{v}View") for m, v in _CONTROL_VIEWS.items()}
    | {(CONTROLS, m, BASE, "StyleView") for m in STYLE_MODELS - {"StyleModel", "LayoutModel"}}
    | {(BASE, "StyleModel", BASE, "StyleView"), (BASE, "LayoutModel", BASE, "LayoutView"),
       (OUTPUT, "OutputModel", OUTPUT, "OutputView"),
       *((CONTROLS, m, vm, None) for m in ("LinkModel", "DirectionalLinkModel") for vm in (CONTROLS, None))})
LINK_MODELS = frozenset({"LinkModel", "DirectionalLinkModel"})
MEDIA_MODELS = frozenset({"ImageModel", "VideoModel", "AudioModel"})
IDENTITY_KEYS = ("_model_module", "_model_name", "_view_module", "_view_name")

HTML, MATH, CSS, ADDRESS, OUTPUTS, MEDIA = "html", "math", "css", "address", "outputs", "media"

Identity = tuple[Any, Any, Any, Any]


def identity(state: dict) -> Identity:
    """The (model module, model name, view module, view name) a state names."""
    return tuple(state.get(k) for k in IDENTITY_KEYS)  # type: ignore[return-value]


def models_of(identities: set[Identity]) -> set[str]:
    """The model names of ``identities`` (one in practice: the browser fixes the class)."""
    return {str(i[1]) for i in identities}


def field_kind(key: str, identities: set[Identity], state: dict) -> str | None:
    """How the views of ``identities`` use field ``key`` of ``state`` (None: as text).

    Parameters
    ----------
    key : str
        A state field.
    identities : set of tuple
        Every accepted identity of the widget (its model class is fixed when
        the browser creates it; its view name may change later).
    state : dict
        The widget's state as the browser will hold it.

    Returns
    -------
    str or None
        One of ``HTML``, ``MATH``, ``CSS``, ``ADDRESS``, ``OUTPUTS``, ``MEDIA`` or None.
    """
    models = {i[1] for i in identities}
    views = {i[3] for i in identities}
    if key == "description":
        return HTML if state.get("description_allow_html") else MATH
    if key == "value":
        if views & {"HTMLView", "HTMLMathView"}:
            return HTML
        if "LabelView" in views:
            return MATH
        if "ColorsInputModel" in models:
            return CSS
        if models & MEDIA_MODELS:
            return ADDRESS if state.get("format") == "url" else MEDIA
    if key == "format" and models & MEDIA_MODELS:
        return MEDIA
    if key == "outputs" and "OutputModel" in models:
        return OUTPUTS
    if models & STYLE_MODELS and not key.startswith("_"):
        return CSS
    return None


def _css_clean(value: Any) -> tuple[Any, bool]:
    if isinstance(value, str):
        return ("", True) if css_loads(value) else (value, False)
    if isinstance(value, list):
        cleaned = [_css_clean(v) for v in value]
        if any(c for _, c in cleaned):
            return [v for v, _ in cleaned], True
    return value, False


def filter_field(kind: str | None, value: Any, filter_outputs: Callable[[list], tuple[list, list[str]]]
                 ) -> tuple[Any, list[str]]:
    """Filter one field value by its kind; returns (value, what was removed in words)."""
    if kind == HTML and isinstance(value, str):
        clean, removed = clean_html(value)
        if clean is None:  # too big or too deep to sanitise (the notice says which)
            return "", removed
        return (value, []) if clean == value else (clean, removed or ["markup"])
    if kind == MATH and isinstance(value, str) and math_active(value):
        return neutralize_math(value), ["math commands that make links or styles"]
    if kind == CSS:
        value, changed = _css_clean(value)
        return value, (["styles that load from an address"] if changed else [])
    if kind == ADDRESS and value not in (b"", "", None):
        return b"", ["a media address the browser would load"]
    if kind == OUTPUTS and isinstance(value, list):
        return filter_outputs(value)
    return value, []


# ----------------------------------------------------------------------------
# Binary buffers: ipywidgets sends bytes out of band, at ``buffer_paths``
# ----------------------------------------------------------------------------


def put_buffers(state: Any, paths: Any, buffers: list[bytes]) -> Any:
    """A copy of ``state`` with each buffer placed at its path (ipywidgets' ``put_buffers``).

    Malformed paths are ignored (their buffers are then dropped by :func:`remove_buffers`).
    """
    state = copy.deepcopy(state)
    if not isinstance(paths, list):
        return state
    for path, buf in zip(paths, buffers):
        if not isinstance(path, list) or not path:
            continue
        obj = state
        try:
            for step in path[:-1]:
                obj = obj[step]
            obj[path[-1]] = bytes(buf)
        except (KeyError, IndexError, TypeError):
            continue
    return state


def remove_buffers(state: Any, prefix: tuple = ()) -> tuple[Any, list[list], list[bytes]]:
    """``state`` with bytes taken out, their paths and the bytes (ipywidgets' ``_remove_buffers``).

    A bytes value in a dict is removed with its key, in a list replaced by None.
    """
    paths: list[list] = []
    buffers: list[bytes] = []

    def walk(obj: Any, path: tuple) -> Any:
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if isinstance(v, (bytes, bytearray, memoryview)):
                    paths.append([*path, k])
                    buffers.append(bytes(v))
                else:
                    out[k] = walk(v, (*path, k))
            return out
        if isinstance(obj, list):
            out_l: list[Any] = []
            for i, v in enumerate(obj):
                if isinstance(v, (bytes, bytearray, memoryview)):
                    paths.append([*path, i])
                    buffers.append(bytes(v))
                    out_l.append(None)
                else:
                    out_l.append(walk(v, (*path, i)))
            return out_l
        return obj

    return walk(state, prefix), paths, buffers


# ----------------------------------------------------------------------------
# The widgets one kernel has shown
# ----------------------------------------------------------------------------


@dataclass
class Widget:
    """One widget as the browser holds it."""

    identities: set[Identity] = field(default_factory=set)
    #: The state the browser has (after filtering), buffers in place as bytes.
    state: dict = field(default_factory=dict)
    #: Operator-allowed modules: relayed as produced.
    trusted: bool = False
    #: Fields that a browser-side link writes: they must stay plain text.
    linked_fields: set[str] = field(default_factory=set)


class WidgetRegistry:
    """The widgets of one kernel: accepted, refused, and what the browser holds.

    Parameters
    ----------
    trusted_modules : collection of str
        Widget modules whose views the operator trusts
        (``SandboxKernel.trusted_widget_modules``): such widgets are accepted
        and relayed unfiltered.
    filter_outputs : callable
        ``filter_outputs(outputs) -> (outputs, removed)``, for ``Output`` widgets.
    """

    def __init__(self, trusted_modules, filter_outputs: Callable[[list], tuple[list, list[str]]]):
        self.trusted_modules = frozenset(trusted_modules)
        self.filter_outputs = filter_outputs
        self.widgets: dict[str, Widget] = {}
        self.refused: set[str] = set()

    def _acceptable(self, ident: Identity, w: Widget, state: dict) -> tuple[bool, bool]:
        """(accepted, trusted) for a widget taking identity ``ident``."""
        if ident in KNOWN_WIDGETS:
            kinds_ok = all(field_kind(f, w.identities | {ident}, state) is None for f in w.linked_fields)
            return kinds_ok, False
        modules = {m for m in (ident[0], ident[2]) if m is not None}
        if modules and modules <= self.trusted_modules:
            return True, True
        return False, False

    def apply(self, model_id: str, incoming: dict) -> tuple[dict | None, list[str]]:
        """Judge a state from the sandbox and return what the browser may receive.

        Parameters
        ----------
        model_id : str
            The widget's comm id.
        incoming : dict
            The state sent (buffers already put in place as bytes).

        Returns
        -------
        (dict or None, list of str)
            The state to send (with re-sent fields whose kind changed), or None
            if the widget is refused, and what was removed in words.
        """
        if model_id in self.refused:
            return None, []
        w = self.widgets.get(model_id) or Widget()
        kinds_before = {k: field_kind(k, w.identities, w.state) for k in w.state}
        removed: list[str] = []
        merged = {**w.state, **incoming}
        ident = identity(merged)
        if ident not in w.identities:
            ok, trusted = self._acceptable(ident, w, merged)
            if not ok and not w.identities:  # a new widget: refused
                self.refused.add(model_id)
                self.widgets.pop(model_id, None)
                return None, [f"a widget drawn by code the kernel does not know ({ident[3]} from {ident[2]})"]
            if not ok:  # a widget the browser has: it keeps its renderer
                incoming = {k: v for k, v in incoming.items() if k not in IDENTITY_KEYS}
                merged = {**w.state, **incoming}
                removed.append("a change of the widget's renderer")
            else:
                w.identities.add(ident)
                w.trusted = w.trusted or trusted
        if incoming.get("description_allow_html") and "description" in w.linked_fields:
            incoming = {k: v for k, v in incoming.items() if k != "description_allow_html"}
            merged = {**w.state, **incoming}
            removed.append("HTML in a linked description")
        self.widgets[model_id] = w
        if w.trusted:
            w.state.update(incoming)
            return incoming, removed
        out: dict = {}
        for key, value in merged.items():
            kind = field_kind(key, w.identities, merged)
            if key not in incoming and kind == kinds_before.get(key):
                continue  # the browser has it, filtered for this kind already
            new_value, what = filter_field(kind, value, self.filter_outputs)
            removed += what
            if key in incoming or new_value != w.state[key]:
                out[key] = new_value  # new, or sent again because its kind changed
        media = models_of(w.identities) & MEDIA_MODELS
        if media and {"format", "value"} & (incoming.keys() | out.keys()):
            held = {**w.state, **out}
            fmt, value, what = judge_media(min(media), held.get("format"), held.get("value"))
            removed += what
            out["format"], out["value"] = fmt, value
        if ident[1] in LINK_MODELS:
            why = self._link_problem(merged)
            if why:
                self.refused.add(model_id)
                self.widgets.pop(model_id, None)
                return None, [why]
        w.state.update(out)
        return out, removed

    def _link_problem(self, state: dict) -> str | None:
        """Why a browser-side link may not be made (None if it may), registering its writes."""
        ends = [state.get("target")] + ([state.get("source")] if state.get("_model_name") == "LinkModel" else [])
        writes = []
        for end in ends:
            if not (isinstance(end, list) and len(end) == 2 and all(isinstance(x, str) for x in end)):
                return "a widget link with a malformed end"
            ref, attr = end
            target = self.widgets.get(ref.removeprefix("IPY_MODEL_"))
            if target is None or attr.startswith("_") or \
                    (not target.trusted and field_kind(attr, target.identities, target.state) is not None):
                return f"a widget link that would write markup into {attr}"
            writes.append((target, attr))
        for target, attr in writes:
            target.linked_fields.add(attr)
        return None

    def observe(self, model_id: str, state: dict) -> None:
        """Record a state the browser itself sent (it already holds it)."""
        if model_id in self.refused:
            return
        w = self.widgets.setdefault(model_id, Widget())
        w.state.update(state)
        if any(k in state for k in IDENTITY_KEYS):
            w.identities.add(identity(w.state))

    def forget(self, model_id: str) -> None:
        """The comm closed: the browser disposed of the model."""
        self.widgets.pop(model_id, None)
