"""Whether this machine can host the Ray backend's sandboxes: what ``doctor`` says on a node.

A node hosts sandboxes when the Python that runs its ``ray start`` imports Ray and
sandbox-kernel (the actor class is imported there by module path) and the runtime
the operator chose (:attr:`.backend.RayBackend.runtime`) runs here: for gVisor, a
runsc that :func:`~sandbox_kernel.backends.local.runsc.choose` finds and that runs a
throwaway ``runsc do /bin/true`` (its probe, cached per binary); for bubblewrap, a
``bwrap`` on ``PATH``.  Which user runs it matters too: as root the sandbox gets
cgroup limits; as an ordinary user (a KubeRay pod's default), gVisor runs rootless,
with the guest's rlimits and a memory watch instead (``docs/security.md``).

No sandbox is started and no cluster is joined; called by
:meth:`.backend.RayBackend.host_report` (``sandbox-kernel doctor``) in a thread.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ...errors import SandboxKernelError


def _ray_facts(facts: list[str], problems: list[str], notes: list[str]) -> None:
    """Ray importable here, and the ``ray`` command of this Python."""
    if importlib.util.find_spec("ray") is None:
        problems.append(f"ray is not importable by {sys.executable}: pip install 'sandbox-kernel[ray]' into the "
                        "Python the node's `ray start` runs (scripts/setup.sh does)")
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        facts.append(f"ray {version('ray')} importable by {sys.executable}")
    except PackageNotFoundError:
        facts.append(f"ray importable by {sys.executable}")
    ray_cli = Path(sys.executable).with_name("ray")
    notes.append(f"start the node with {ray_cli} (`ray start --address=HEAD:PORT --resources=...`) so its workers "
                 "import sandbox_kernel; its Ray version must be the cluster's" if ray_cli.exists() else
                 f"no `ray` command beside {sys.executable}: the node's `ray start` must run a Python that imports "
                 "sandbox_kernel")


def _gvisor(runsc_path: str, facts: list[str], problems: list[str], notes: list[str]) -> bool:
    """runsc found and running here (its probe); True when it does."""
    from ..local import runsc

    if not runsc.have_runsc(runsc_path):
        where = f"RayBackend.runsc_path={runsc_path!r}" if runsc_path else \
            f"{runsc.PRIVATE_RUNSC} or runsc on PATH"
        problems.append(f"runsc not found ({where}): bash scripts/setup.sh installs it on the node, or set "
                        "RayBackend.runsc_path")
        return False
    try:
        choice = runsc.choose(runsc_path)
    except SandboxKernelError as err:
        problems.append(str(err))
        return False
    facts.append(f"{choice.boundary} at {choice.path}: `runsc do /bin/true` runs here")
    if choice.rootless:
        notes.append(f"as uid {os.geteuid()}, not root: gVisor runs rootless (--rootless --ignore-cgroups): no "
                     "cgroup limits, the guest's rlimits and a memory watch instead, no restore; run the node's "
                     "`ray start` as root for cgroup limits")
    return True


def _cgroups(notes: list[str]) -> None:
    from ..local.cgroups import cgroups_usable

    ok, why = cgroups_usable()
    notes.append(f"cgroups: {why}" if ok else f"cgroups unusable ({why}): sandboxes start without cgroup limits")


def host_report(runtime: str, runsc_path: str = "") -> dict[str, Any]:
    """Whether this machine can host Ray sandboxes with ``runtime`` (``gvisor``,
    ``bubblewrap`` or ``auto``: gVisor, else bubblewrap) and ``runsc_path`` ('': as the
    local backend finds it).

    Blocking: may run runsc's probe (about a second the first time per binary).

    Returns
    -------
    dict
        ``can_host`` (bool), ``runtime`` (the one in force, or None), ``facts``,
        ``problems`` (each with its next step) and ``notes`` (lists of str).
    """
    facts: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    _ray_facts(facts, problems, notes)
    in_force: str | None = None
    runtime_problems: list[str] = []
    if runtime in ("gvisor", "auto") and _gvisor(runsc_path, facts, runtime_problems, notes):
        in_force = "gvisor"
    if in_force is None and runtime in ("bubblewrap", "auto"):
        bwrap = shutil.which("bwrap")
        if bwrap:
            in_force = "bubblewrap"
            facts.append(f"bubblewrap at {bwrap} (a shared-kernel sandbox: namespaces and seccomp)")
        else:
            runtime_problems.append("bwrap not found: apt-get install bubblewrap")
    if in_force is None:
        problems += runtime_problems
    elif in_force == "bubblewrap" and runtime == "auto":
        notes += [f"gVisor unusable, bubblewrap in force: {p}" for p in runtime_problems]
    if in_force is not None and os.geteuid() == 0:
        _cgroups(notes)
    return {"can_host": not problems, "runtime": in_force, "facts": facts, "problems": problems, "notes": notes}
