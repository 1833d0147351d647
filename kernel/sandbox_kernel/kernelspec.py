"""Write kernelspecs for the proxy kernel, like ``python -m ipykernel install``."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from .errors import ConfigError
from .options import route_options


def _backend_display_name(backend: str) -> str:
    """The backend class's ``display_name``, or its entry-point name if it cannot be
    imported here (its SDK may be missing where the kernelspec is written)."""
    from .backends import load_backend

    try:
        return load_backend(backend).display_name or backend
    except Exception:  # noqa: BLE001  a missing extra is not an install error
        return backend


def _default_display_name(backend: str, options: Mapping[str, Any]) -> str:
    """``Python 3 (sandbox: local)``, plus what sets this kernelspec apart
    (``Python 3 (sandbox: local, bubblewrap, 1024 MiB, 5 s/cell, folder ro)``)."""
    base = f"Python 3 (sandbox: {_backend_display_name(backend)})"
    extras = []
    if options.get("runtime") not in (None, "auto"):
        extras.append(str(options["runtime"]))
    if options.get("memory_mib") is not None:
        extras.append(f"{options['memory_mib']} MiB")
    if options.get("cell_timeout_s"):
        extras.append(f"{options['cell_timeout_s']:g} s/cell")
    if options.get("workspace") in ("ro", "rw"):  # the notebook's folder is exposed: say so in the picker
        extras.append(f"folder {options['workspace']}")
    return base[:-1] + "".join(", " + e for e in extras) + ")" if extras else base


#: The kernel provisioner of ``--prestart`` kernelspecs (entry point of
#: ``jupyter_client.kernel_provisioners``, :class:`~.prestart.PrestartedProvisioner`).
PROVISIONER = "sandbox-kernel-prestarted"


def kernel_dict(backend: str = "local", options: Mapping[str, Any] | None = None,
                display_name: str | None = None, python: str | None = None,
                prestart: int = 0) -> dict[str, Any]:
    """The ``kernel.json`` content.

    Parameters
    ----------
    backend : str
        Backend entry-point name.
    options : mapping, optional
        Option name -> value: a policy or kernel option is appended to argv as
        ``--SandboxKernel.<name>=<value>``, a backend option as
        ``--<BackendClass>.<name>=<value>`` (``--LocalBackend.runtime=gvisor``);
        the old ``backend_options`` dict is split into backend options.
    display_name : str, optional
        Defaults to ``"Python 3 (sandbox: <backend's display name>)"``.
    python : str, optional
        Interpreter that runs the proxy; defaults to ``sys.executable``.
    prestart : int, default 0
        Spare proxies a Jupyter server keeps ready for this kernelspec (its
        ``metadata.kernel_provisioner`` names :class:`~.prestart.PrestartedProvisioner`;
        the server's environment must have sandbox-kernel installed, or it does not list
        the kernel); 0 launches every kernel as a new process.

    Raises
    ------
    ConfigError
        For an option that is neither the kernel's nor the backend's.
    """
    template = resources.files("sandbox_kernel").joinpath("resources/kernel.json.in").read_text()
    spec = json.loads(template.replace("@PYTHON@", json.dumps(python or sys.executable)[1:-1]))
    spec["argv"].append(f"--SandboxKernel.backend={backend}")
    for cls, name, value in route_options(backend, options or {}):
        spec["argv"] += [f"--{cls}.{name}={v}" for v in _argv_values(value)]
    spec["display_name"] = display_name or _default_display_name(backend, options or {})
    spec["metadata"]["sandbox_kernel"] = {"backend": backend, **{k: v for k, v in (options or {}).items()}}
    # JupyterLab enables its debugger from this flag: the sandbox's ipykernel debugs with
    # debugpy, present where the proxy's Python has it (the local sandboxes mount that
    # environment; E2B's and Modal's images carry ipykernel and its debugpy dependency).
    spec["metadata"]["debugger"] = backend != "local" or importlib.util.find_spec("debugpy") is not None
    if prestart < 0:
        raise ConfigError("prestart", prestart, "the number of spare proxies cannot be negative")
    if prestart:
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": PROVISIONER,
                                                  "config": {"spares": prestart}}
    return spec


def _argv_values(value: Any) -> list[str]:
    """One option's value as argv strings that traitlets reads back unchanged.

    A list becomes one ``--X.trait=item`` per item and a dict one
    ``--X.trait=NAME=VALUE`` per item (traitlets 5 appends repeated options; a
    list literal would become one string item, and the ``{...}`` literal form of
    a dict is deprecated), so an empty one writes nothing and leaves the trait's
    default.  Values must be str, int, float, bool or None, or lists of those;
    a dict's names and values must be strings.

    Raises
    ------
    ConfigError
        For a dict name that is not a non-empty string without ``=``.
    """
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str) or not k or "=" in k:
                raise ConfigError(str(k), value[k], "a name must be a non-empty string without '='")
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


#: The kernelspec's logo files (Jupyter's kernelspec spec: ``logo-32x32.png``,
#: ``logo-64x64.png``, ``logo-svg.svg``), shipped in ``sandbox_kernel/resources``.
LOGOS = ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg")


def install(name: str = "sandbox-local", *, backend: str = "local", options: Mapping[str, Any] | None = None,
            display_name: str | None = None, user: bool = False, prefix: str | None = None,
            sys_prefix: bool = False, prestart: int = 0) -> str:
    """Install a kernelspec; return the directory it was written to.

    ``user``/``sys_prefix``/``prefix`` choose where, as for ``jupyter kernelspec install``;
    ``prestart`` as for :func:`kernel_dict`.
    The directory is mode 0755 and its files 0644 whatever the umask, as
    ``ipykernel install`` gives, so a kernelspec root installs is listed for
    every user.
    """
    if sys_prefix:
        prefix = sys.prefix
    spec = kernel_dict(backend, options, display_name, prestart=prestart)
    with tempfile.TemporaryDirectory() as td:
        # Staged in a directory of its own with explicit modes: the copy keeps them, and a
        # TemporaryDirectory is 0700, so a root install would be invisible to other users.
        d = Path(td) / name
        d.mkdir()
        d.chmod(0o755)
        (d / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        # Our own logo (a Python box with dashed walls), so the Launcher tells this kernel
        # from the stock one at a glance.
        logos = resources.files("sandbox_kernel").joinpath("resources")
        for logo in LOGOS:
            shutil.copyfile(str(logos.joinpath(logo)), d / logo)
        for f in d.iterdir():
            f.chmod(0o644)
        return KernelSpecManager().install_kernel_spec(str(d), name, user=user, prefix=prefix)
