"""How the package's modules depend on each other: no circles, frontends that never
reach the agent's wire, and a light watchdog.

The import graph is read from the source (``ast``), lazy imports inside
functions and ``if TYPE_CHECKING:`` imports included: they are dependencies
too (a type named from a higher module is a climb back up, and a circle the
day someone needs it at run time).  Nothing is executed but one fresh
interpreter importing the watchdog's module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import sandbox_kernel

ROOT = Path(sandbox_kernel.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["sandbox_kernel", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _targets(module: str, path: Path) -> set[str]:
    """Modules of this package that ``module`` imports, anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in child.names:  # ``from pkg import module`` names a module
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {t for t in found if t in MODULES and t != module}


GRAPH = {m: _targets(m, p) for m, p in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Every import circle (one path around each strongly connected group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(GRAPH):
        if v not in index:
            strong(v)
    return groups


def test_the_graph_sees_known_edges():
    """The scan finds relative, absolute and lazy imports (else the next test proves nothing)."""
    local = "sandbox_kernel.backends.local"
    assert f"{local}.sandbox" in GRAPH[f"{local}.backend"]                   # from .sandbox import
    assert f"{local}.pool.client" in GRAPH[f"{local}.backend"]               # from .pool import client
    assert f"{local}.sandbox" in GRAPH[f"{local}.watchdog"]                  # lazy, inside main()
    assert f"{local}.pool.daemon" in GRAPH["sandbox_kernel.cli"]             # lazy, absolute-relative
    assert "sandbox_kernel.policy" in GRAPH[f"{local}.pool.wire"]            # from ....policy import
    assert f"{local}.cgroups" in GRAPH[f"{local}.runtime"]                   # under if TYPE_CHECKING:


def test_no_import_circles():
    assert _cycles() == []


def test_pool_and_backend_depend_one_way():
    local = "sandbox_kernel.backends.local"
    assert f"{local}.backend" not in GRAPH[f"{local}.pool.client"]
    assert f"{local}.backend" not in GRAPH[f"{local}.service.client"]
    assert f"{local}.service.server" not in GRAPH[f"{local}.service.client"]  # a proxy loads no server
    assert f"{local}.backend" not in GRAPH[f"{local}.pool.daemon"]
    assert "sandbox_kernel.cli" not in GRAPH[f"{local}.pool.daemon"]


def test_lower_modules_name_the_higher_ones_through_protocols():
    """Each seam is a ``typing.Protocol`` in the lower module, never an import back up,
    even for a type: the link's (``inflight.MessageHost``, ``files.TransferLink``), the
    proxy kernel's parts' (``kernel_face.KernelFace``: the file comm, the cells, subshells,
    the debugger, usage, the IPython setup), the local runtimes' (``runtime.SandboxRecord``)
    and the pool clients' (``pool.client.Adopter``)."""
    local = "sandbox_kernel.backends.local"
    climbs = {
        "sandbox_kernel.inflight": "sandbox_kernel.relay",
        "sandbox_kernel.files": "sandbox_kernel.relay",
        **{f"sandbox_kernel.{part}": "sandbox_kernel.proxy" for part in (
            "kernel_face", "files_comm", "cells", "subshells", "features", "usage", "interpreter_config")},
        f"{local}.runtime": f"{local}.sandbox",
        f"{local}.bwrap": f"{local}.sandbox",
        f"{local}.gvisor": f"{local}.sandbox",
        f"{local}.service.client": f"{local}.sandbox",
    }
    assert {low: high for low, high in climbs.items() if high in GRAPH[low]} == {}


def test_cloud_backends_do_not_import_the_local_stack():
    for cloud in ("sandbox_kernel.backends.e2b", "sandbox_kernel.backends.modal"):
        assert not {m for m in GRAPH[cloud] if m.startswith("sandbox_kernel.backends.local")}, cloud


def test_the_watchdog_waits_with_nothing_loaded():
    """One watchdog process runs beside every sandbox: while it waits it holds the
    standard library and this package's ``__init__`` modules only."""
    code = ("import sys, sandbox_kernel.backends.local.watchdog\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('sandbox_kernel', 'zmq', 'jupyter_client', 'traitlets', 'ipykernel', 'importlib_metadata'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    assert out == ["sandbox_kernel", "sandbox_kernel.backends", "sandbox_kernel.backends.local",
                   "sandbox_kernel.backends.local.watchdog", "sandbox_kernel.errors"]


#: The agent's wire: the framed protocol, its reader, the link, and the code inside the sandbox.
WIRE = ("sandbox_kernel.protocol", "sandbox_kernel.channel", "sandbox_kernel.relay", "sandbox_kernel.guest")
#: The frontends: the agent client, the file comm's blocking client and the MCP server.
FRONTENDS = sorted(m for m in MODULES if m.startswith(("sandbox_kernel.client", "sandbox_kernel.mcp",
                                                  "sandbox_kernel.files_client")))


def _reached(module: str) -> set[str]:
    """Every module ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in GRAPH[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_frontends_are_found():
    assert {"sandbox_kernel.client", "sandbox_kernel.client.sandbox", "sandbox_kernel.files_client",
            "sandbox_kernel.mcp.server", "sandbox_kernel.mcp.http", "sandbox_kernel.mcp.output"} <= set(FRONTENDS)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_frontends_import_nothing_of_the_agents_wire(frontend):
    """The agent client and the MCP server are clients of the kernel like any frontend:
    they speak the Jupyter protocol, never the agent's (ARCHITECTURE.md)."""
    wire = {m for m in _reached(frontend) if m.startswith(WIRE)}
    assert wire == set(), f"{frontend} reaches the agent's wire through its imports: {sorted(wire)}"
