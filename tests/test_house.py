"""Guards that keep the house in shape: no field written and never read.

Read from the source (``ast``); nothing of the package is run but its imports.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import sandbox_kernel
from sandbox_kernel.backends.base import Capabilities

ROOT = Path(sandbox_kernel.__file__).parent


def _attributes_read() -> set[str]:
    """Every ``x.name`` the package reads (not assigns), over all its modules."""
    names: set[str] = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
    return names


READ = _attributes_read()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Capabilities)])
def test_every_capability_is_read(field):
    """A backend declares only what some part of the package acts on or shows
    (``Capabilities(x=...)`` and ``replace(caps, x=...)`` are writes, not reads)."""
    assert field in READ, f"Capabilities.{field} is set by backends and read nowhere: use it or remove it"
