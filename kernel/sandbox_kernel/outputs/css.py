"""``<style>`` blocks from the sandbox, confined to the output they came with.

Every kept selector is rewritten to be a descendant of a wrapper class the
firewall chooses at random for each output (:func:`new_scope`); the sandbox
cannot know it, so no rule it writes can match an element outside that output:
not the page (``#main``, ``.jp-*``, CodeMirror's ``.cm-*``, ``body``,
``:root``), not a sibling output, not the firewall's notices (plain-text
outputs of their own, never inside a wrapper).  Whatever a selector holds
after the prefix (``:is()``, ``:has()``, ``~``), its subject is an element
inside the wrapper.  Parsed with ``tinycss2``.
"""

from __future__ import annotations

import re
import secrets

import tinycss2

from .common import css_loads

#: Names of JupyterLab's, Lumino's, CodeMirror's and the widgets' own classes and ids, the
#: firewall's wrappers, and the pseudo-classes and type selectors of the page itself.
_UI_NAME = re.compile(r"^(jp-|lm-|p-|mod-|cm-|sbk-|MathJax|widget-|jupyter-|main$|root$|host$|html$|body$)", re.I)
#: Functional pseudo-classes/elements about a shadow host or its parts.
_PAGE_FUNCTIONS = frozenset({"host", "host-context", "part", "slotted"})
#: At-rules whose body is a list of rules, judged rule by rule.
_GROUPING = frozenset({"media", "supports"})


def new_scope() -> str:
    """A fresh wrapper class for one output: ``sbk-out-`` and 12 random hex digits."""
    return f"sbk-out-{secrets.token_hex(6)}"


def _split_alternatives(prelude: list) -> list[list]:
    parts: list[list] = [[]]
    for tok in prelude:
        if tok.type == "literal" and tok.value == ",":
            parts.append([])
        else:
            parts[-1].append(tok)
    return parts


def _tokens_ok(tokens: list) -> bool:
    """Selector syntax only: no strings, URLs, blocks, nesting ``&`` or escapes."""
    for tok in tokens:
        if tok.type in ("string", "url", "[] block", "{} block", "() block", "at-keyword", "error", "number",
                        "percentage", "dimension", "unicode-range"):
            if tok.type == "[] block" and _tokens_ok(tok.content):
                continue
            if tok.type in ("number", "dimension"):  # :nth-child(2n+1)
                continue
            return False
        if tok.type == "literal" and tok.value not in (".", ">", "+", "~", "*", ":", "|", "=", "^=", "$=", "*=",
                                                       "~=", "|=", "-", ","):
            return False
        if tok.type == "function" and not _tokens_ok(tok.arguments):
            return False
        name = tok.lower_name if tok.type == "function" else getattr(tok, "value", "")
        if tok.type in ("ident", "hash", "function") and _UI_NAME.match(name.lstrip("-")):
            return False
        if tok.type == "function" and name in _PAGE_FUNCTIONS:
            return False
        if tok.type == "ident" and "\\" in tinycss2.serialize([tok]):
            return False
    return True


def _scoped_selector(prelude: list, scope: str) -> str | None:
    """Each alternative of ``prelude`` prefixed with ``.scope``, or None if one is not allowed.

    An alternative must start with a class or id (the output's own names, none of
    :data:`_UI_NAME`) and use selector syntax only.
    """
    out = []
    for alt in _split_alternatives(prelude):
        while alt and alt[0].type == "whitespace":
            alt = alt[1:]
        while alt and alt[-1].type == "whitespace":
            alt = alt[:-1]
        if not alt or not _tokens_ok(alt):
            return None
        first = alt[0]
        starts_named = (first.type == "hash" and first.is_identifier) or (
            first.type == "literal" and first.value == "." and len(alt) > 1 and alt[1].type == "ident")
        if not starts_named:
            return None
        _scope_ids(alt, scope)
        text = " ".join(tinycss2.serialize(alt).split())
        if any(c in text for c in "\\<{};@&\"'"):
            return None
        out.append(f".{scope} {text}")
    return ", ".join(out)


def _scope_ids(tokens: list, scope: str) -> None:
    """Rewrite every id selector ``#x`` among ``tokens`` (within ``:is()``/``:not()`` too) to
    ``#<scope>-x``, the id the output's element carries (:func:`.html.scoped_id`)."""
    for tok in tokens:
        if tok.type == "hash":
            tok.value = f"{scope}-{tok.value}"
        elif tok.type == "function":
            _scope_ids(tok.arguments, scope)


def _declarations(content: list, allowed: frozenset[str]) -> tuple[list[str], bool]:
    kept, dropped = [], False
    for decl in tinycss2.parse_declaration_list(content, skip_comments=True, skip_whitespace=True):
        value = " ".join(tinycss2.serialize(decl.value).split()) if decl.type == "declaration" else ""
        if (decl.type != "declaration" or decl.lower_name not in allowed or css_loads(value)
                or any(c in value for c in "\\<>{};@")):
            dropped = True
            continue
        kept.append(f"{decl.lower_name}: {value}{' !important' if decl.important else ''}")
    return kept, dropped


def _rules(rules: list, scope: str, allowed: frozenset[str], depth: int) -> tuple[list[str], bool]:
    out: list[str] = []
    dropped = False
    for rule in rules:
        if rule.type == "qualified-rule":
            selector = _scoped_selector(rule.prelude, scope)
            kept, lost = _declarations(rule.content or [], allowed) if selector else ([], True)
            dropped |= lost
            if selector and kept:
                out.append(f"{selector} {{{'; '.join(kept)}}}")
            elif selector:
                dropped = True
        elif (rule.type == "at-rule" and rule.lower_at_keyword in _GROUPING and rule.content is not None
              and depth < 4):
            cond = " ".join(tinycss2.serialize(rule.prelude).split())
            if css_loads(cond) or any(c in cond for c in "\\<>{};@\"'"):
                dropped = True
                continue
            inner, lost = _rules(tinycss2.parse_rule_list(rule.content, skip_comments=True,
                                                          skip_whitespace=True), scope, allowed, depth + 1)
            dropped |= lost
            if inner:
                out.append(f"@{rule.lower_at_keyword} {cond} {{{' '.join(inner)}}}")
        elif rule.type != "whitespace" and rule.type != "comment":
            dropped = True  # @import, @font-face, @namespace, @keyframes, unknown at-rules, errors
    return out, dropped


def scope_stylesheet(css: str, scope: str, allowed: frozenset[str]) -> tuple[str, bool]:
    """Keep the rules of a ``<style>`` block, each confined to the output's wrapper.

    Parameters
    ----------
    css : str
        The text of one ``<style>`` element.
    scope : str
        The wrapper class of this output (:func:`new_scope`).
    allowed : frozenset of str
        The CSS properties that may be kept.

    Returns
    -------
    (str, bool)
        The rebuilt stylesheet, every selector starting with ``.scope``
        (empty if nothing is left), and whether anything was dropped.
    """
    out, dropped = _rules(tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True),
                          scope, allowed, 0)
    return "\n".join(out), dropped
