"""The report's prose: markdown templates in ``bench/explain/``, filled with ``str.format``.

A template is markdown wrapped for reading; :func:`unwrap` joins each paragraph's lines
into one, as the generated ``docs/benchmarks.md`` has them. A line starts a new output
line when it follows a blank line or starts a heading (``#``), a list item (``* ``), a
table row (``|``) or an HTML comment; lines inside a ```` ``` ```` fence are kept as they are.
Placeholders are ``{name}`` or ``{name:.2f}`` (``str.format``), so a literal brace is
written ``{{`` or ``}}``.

>>> unwrap("# Title\\n\\nOne paragraph\\nwrapped.\\n* an item\\n  continued\\n")
['# Title', '', 'One paragraph wrapped.', '* an item continued']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXPLAIN = Path(__file__).resolve().parent / "explain"

_STARTS = ("#", "* ", "|", "<!--")


def unwrap(text: str) -> list[str]:
    """The output lines of a template text (see the module docstring)."""
    out: list[str] = []
    fence = False
    for raw in text.rstrip("\n").split("\n"):
        line = raw.strip()
        if line.startswith("```"):
            fence = not fence
            out.append(raw)
        elif fence:
            out.append(raw)
        elif not line or not out or not out[-1] or line.startswith(_STARTS) or out[-1].startswith("```"):
            out.append(line)
        else:
            out[-1] += " " + line
    return out


def lines(name: str, **values: Any) -> list[str]:
    """``explain/<name>.md`` filled with ``values``, as lines."""
    return [line.format(**values) for line in unwrap((EXPLAIN / f"{name}.md").read_text())]


def section(name: str, **values: Any) -> list[str]:
    """``explain/<name>.md`` filled with ``values``, as lines, followed by a blank line."""
    return [*lines(name, **values), ""]


def fragment(name: str, **values: Any) -> str:
    """``explain/<name>.md`` filled with ``values``, as one line (a piece of a sentence)."""
    text = " ".join(unwrap((EXPLAIN / f"{name}.md").read_text()))
    return text.format(**values)
