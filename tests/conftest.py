"""Shared fixtures: real kernels through installed kernelspecs, one per local runtime.

Kernelspecs are installed into a temporary prefix that ``JUPYTER_PATH`` points
at, so tests never touch the user's Jupyter configuration.  Every cell runs
inside a sandbox (gVisor or bubblewrap); nothing here executes cell code on
the host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from kernels import RUNTIMES, Kernel, kernel_name_for
from sandbox_kernel.kernelspec import install


@pytest.fixture(scope="session")
def kernelspec_prefix(tmp_path_factory) -> str:
    """A prefix holding test kernelspecs; ``JUPYTER_PATH`` points at it."""
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(prefix / "share" / "jupyter"), *filter(None, [os.environ.get("JUPYTER_PATH")])])
    for runtime in RUNTIMES:
        install(kernel_name_for(runtime), options={"runtime": runtime}, prefix=str(prefix))
    return str(prefix)


@pytest.fixture(scope="session")
def install_kernelspec(kernelspec_prefix) -> Callable[..., str]:
    """Install an extra kernelspec with policy options; returns its name."""

    def _install(runtime: str, variant: str, **options: Any) -> str:
        name = kernel_name_for(runtime, variant)
        install(name, options={"runtime": runtime, **options}, prefix=kernelspec_prefix)
        return name

    return _install


@pytest.fixture(params=RUNTIMES)
def runtime(request) -> str:
    return request.param


@pytest.fixture
def kernel(kernelspec_prefix, runtime):
    """A fresh sandboxed kernel on each local runtime."""
    k = Kernel(kernel_name_for(runtime))
    yield k
    k.shutdown()


@pytest.fixture
def start_kernel(kernelspec_prefix):
    """Factory for kernels of a given kernelspec name; all shut down at teardown."""
    started: list[Kernel] = []

    def _start(name: str) -> Kernel:
        k = Kernel(name)
        started.append(k)
        return k

    yield _start
    for k in started:
        k.shutdown()


_SESSION_START = time.time()


def _mtime(d) -> float:
    try:
        return d.stat().st_mtime
    except OSError:
        return 0.0


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a test left a sandbox behind (state dir whose proxy is gone)."""
    from sandbox_kernel.backends.local.reaper import orphans

    deadline = time.time() + 15  # watchdogs reap asynchronously
    while True:
        # a directory without a tag (its owner died before writing it) counts by its mtime
        leaked = [d for d, tag in orphans() if (tag.get("created_at") or _mtime(d)) >= _SESSION_START]
        if not leaked or time.time() > deadline:
            break
        time.sleep(0.5)
    if leaked:
        print(f"\nleaked sandboxes (state dirs whose proxy is gone): {[d.name for d in leaked]}")
        session.exitstatus = 1
