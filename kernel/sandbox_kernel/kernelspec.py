"""Write kernelspecs for the proxy kernel, like ``python -m ipykernel install``."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from jupyter_client.kernelspec import KernelSpecManager

DISPLAY_NAMES = {"local": "Python 3 (sandbox: local)", "e2b": "Python 3 (sandbox: E2B)",
                 "modal": "Python 3 (sandbox: Modal)"}


def _default_display_name(backend: str, options: Mapping[str, Any]) -> str:
    """``Python 3 (sandbox: local)``, plus what sets this kernelspec apart
    (``Python 3 (sandbox: local, bubblewrap, 1024 MiB, 5 s/cell)``)."""
    base = DISPLAY_NAMES.get(backend, f"Python 3 (sandbox: {backend})")
    extras = []
    if options.get("runtime") not in (None, "auto"):
        extras.append(str(options["runtime"]))
    if options.get("memory_mib") is not None:
        extras.append(f"{options['memory_mib']} MiB")
    if options.get("cell_timeout_s"):
        extras.append(f"{options['cell_timeout_s']:g} s/cell")
    return base[:-1] + "".join(", " + e for e in extras) + ")" if extras else base


def kernel_dict(backend: str = "local", options: Mapping[str, Any] | None = None,
                display_name: str | None = None, python: str | None = None) -> dict[str, Any]:
    """The ``kernel.json`` content.

    Parameters
    ----------
    backend : str
        Backend entry-point name.
    options : mapping, optional
        ``SandboxKernel`` trait name -> value, appended to argv as
        ``--SandboxKernel.<name>=<value>`` (the operator's policy).
    display_name : str, optional
        Defaults to ``"Python 3 (sandbox: <backend>)"``.
    python : str, optional
        Interpreter that runs the proxy; defaults to ``sys.executable``.
    """
    template = resources.files("sandbox_kernel").joinpath("resources/kernel.json.in").read_text()
    spec = json.loads(template.replace("@PYTHON@", json.dumps(python or sys.executable)[1:-1]))
    spec["argv"].append(f"--SandboxKernel.backend={backend}")
    for name, value in (options or {}).items():
        spec["argv"] += [f"--SandboxKernel.{name}={v}" for v in _argv_values(value)]
    spec["display_name"] = display_name or _default_display_name(backend, options or {})
    spec["metadata"]["sandbox_kernel"] = {"backend": backend, **{k: v for k, v in (options or {}).items()}}
    return spec


def _argv_values(value: Any) -> list[str]:
    """One option's value as argv strings that traitlets reads back unchanged.

    traitlets parses ``--X.trait={...}`` for a ``Dict`` trait with
    :func:`ast.literal_eval`, so a dict is written as a Python literal (JSON's
    ``true``/``false``/``null`` would fail there and the kernel would not
    start).  A list becomes one ``--X.trait=item`` per item (traitlets appends
    repeated options; a list literal would become one string item), so an
    empty list writes nothing and leaves the trait's default.  Values must be
    JSON-compatible: str, int, float, bool, None, and lists and dicts of those.
    """
    if isinstance(value, dict):
        return [repr(json.loads(json.dumps(value, allow_nan=False)))]  # rejects non-JSON objects
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def install(name: str = "sandbox-local", *, backend: str = "local", options: Mapping[str, Any] | None = None,
            display_name: str | None = None, user: bool = False, prefix: str | None = None,
            sys_prefix: bool = False) -> str:
    """Install a kernelspec; return the directory it was written to.

    ``user``/``sys_prefix``/``prefix`` choose where, as for ``jupyter kernelspec install``.
    """
    if sys_prefix:
        prefix = sys.prefix
    spec = kernel_dict(backend, options, display_name)
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        (d / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        logos = resources.files("ipykernel").joinpath("resources")
        for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
            src = logos.joinpath(logo)
            if src.is_file():
                shutil.copyfile(str(src), d / logo)
        return KernelSpecManager().install_kernel_spec(str(d), name, user=user, prefix=prefix)
