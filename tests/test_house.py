"""Guards that keep the house in shape: no field written and never read, no module
over 600 lines without a listed reason (the import graph's guards are in
``test_imports.py``).

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


#: Longest a module of the package may be, lines, unless listed in docs/architecture.md.
MAX_LINES = 600
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _listed_long_modules() -> dict[str, str]:
    """``docs/architecture.md``'s "Modules over 600 lines": module path -> reason."""
    text = ARCHITECTURE.read_text()
    section = text.split("### Modules over 600 lines", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return {path.strip().strip("`"): reason.strip() for path, reason in rows}


def test_no_module_over_600_lines_unless_listed_with_a_reason():
    listed = _listed_long_modules()
    assert listed and all(listed.values()), "every listed module says why"
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    long = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert {path: n for path, n in long.items() if path not in listed} == {}, \
        f"over {MAX_LINES} lines: split it, or list it with a reason in docs/architecture.md"
    assert [path for path in listed if path not in long] == [], \
        "listed in docs/architecture.md but not over the limit (or gone): remove the row"


#: The parts of the proxy kernel that reach it through ``kernel_face.KernelFace`` only.
KERNEL_PARTS = ("cells", "subshells", "features", "usage", "files_comm", "interpreter_config")


def _kernel_members_used(path: Path) -> set[str]:
    """Members a module reads of the kernel it was handed: ``self.kernel.x``, ``kernel.x``, ``k.x``."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Attribute) and v.attr == "kernel" and isinstance(v.value, ast.Name)
                and v.value.id == "self") or (isinstance(v, ast.Name) and v.id in ("kernel", "k")):
            used.add(node.attr)
    return used


@pytest.mark.parametrize("part", KERNEL_PARTS)
def test_the_proxys_parts_use_nothing_of_it_but_its_face(part):
    """Cells, subshells, the debugger, usage, the file comm and the IPython setup use the
    kernel's ``KernelFace`` members, never ipykernel's or the proxy's other members."""
    from sandbox_kernel.kernel_face import KernelFace

    face = {name for name in vars(KernelFace) if not name.startswith("_")}
    used = _kernel_members_used(ROOT / f"{part}.py")
    assert used, f"{part}.py: the scan found no use of the kernel (it proves nothing)"
    assert used - face == set(), f"{part}.py reaches past KernelFace: add a verb to the face, or use one"
