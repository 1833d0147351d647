"""Shared fixtures: real kernels through installed kernelspecs, one per local runtime.

Kernelspecs are installed into a temporary prefix that ``JUPYTER_PATH`` points
at, so tests never touch the user's Jupyter configuration.  Every cell runs
inside a sandbox (gVisor or bubblewrap); nothing here executes cell code on
the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from kernels import RUNTIMES, Kernel, kernel_name_for
from sandbox_kernel.kernelspec import install

# Property tests draw the same examples on every run (a flaky test is a failing test): a new
# counterexample is found by raising max_examples or changing the strategy, on purpose, not
# by CI's luck.
hypothesis_settings.register_profile("deterministic", derandomize=True, database=None)
hypothesis_settings.load_profile("deterministic")


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


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request) -> str:
    """Each local runtime in turn (module-scoped, so a module's tests run runtime by runtime
    and :func:`shared_kernel` starts one kernel per module and runtime)."""
    return request.param


@pytest.fixture
def kernel(kernelspec_prefix, runtime):
    """A fresh sandboxed kernel on each local runtime: for a test of a start, a death, an
    interrupt's aftermath or a sandbox's state."""
    k = Kernel(kernel_name_for(runtime))
    yield k
    k.shutdown()


@pytest.fixture(scope="module")
def _module_kernel(kernelspec_prefix, runtime):
    k = Kernel(kernel_name_for(runtime))
    yield k
    k.shutdown()


@pytest.fixture
def shared_kernel(_module_kernel):
    """One sandboxed kernel per module and runtime, for tests that only read behaviour (as
    ipykernel's own suite shares one).  After each test it must still be what the next test
    expects: alive, idle, answering a cell at once; else the test errors and the module's
    later tests get a fresh one."""
    k = _module_kernel
    yield k
    k.kc.__dict__.pop("get_iopub_msg", None)  # a test's watcher (test_cases.Cells) ends with it
    try:
        ok = k.execute("pass", timeout=30).status == "ok" and k.km.is_alive()
    except TimeoutError:
        ok = False
    if not ok:
        k.shutdown()
        k.__init__(k.name)  # the same object, so the module's later tests see a fresh kernel
        pytest.fail("the shared kernel was left busy or dead: this test needs the `kernel` fixture")


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

# ----------------------------------------------------------------------------
# Tiers: every test gets exactly the markers of what it needs, by where it lives
# and which fixtures it takes; nobody keeps a list of files.
# ----------------------------------------------------------------------------

_TESTS = Path(__file__).parent
#: Tiers by folder or file (a test in several gets each marker).
_TIER_PATHS = {
    "browser": ("browser",),
    "nonroot": ("nonroot", "test_nonroot.py", "test_service.py", "test_service_workspace.py", "test_service_copies.py",
                "test_workspace_owner_nonroot.py", "browser/test_lab_as_user.py"),
    "soak": ("test_soak.py",),
    "sandbox": ("backends",),
}
#: A test taking one of these fixtures starts real sandboxes.
_SANDBOX_FIXTURES = frozenset({"kernelspec_prefix", "install_kernelspec", "kernel", "shared_kernel", "start_kernel",
                               "e2b_emulator", "modal_emulator"})
TIERS = ("fast", "sandbox", "browser", "nonroot", "soak", "live")
#: The whole run's budget (minutes): past it, the run fails naming the slowest tests.
SUITE_BUDGET_MIN = 55.0


def _tiers_of(item) -> set[str]:
    explicit = {t for t in TIERS if item.get_closest_marker(t)}  # a module's own pytestmark counts
    path = Path(str(item.path))
    rel = path.relative_to(_TESTS).as_posix() if path.is_relative_to(_TESTS) else ""
    by_path = {tier for tier, places in _TIER_PATHS.items()
               if any(rel == p or rel.startswith(p + "/") for p in places)}
    by_fixture = {"sandbox"} if _SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())) else set()
    return (explicit | by_path | by_fixture) or {"fast"}


#: Tiers whose tests share something of the machine beyond a state base (the ordinary
#: users they create, the root sandbox service): one xdist worker runs them, one by one.
_MACHINE_WIDE = ("nonroot",)


def pytest_configure(config):
    for tier in TIERS[:-1]:  # ``live`` is registered in pyproject.toml (it is put on by hand)
        config.addinivalue_line("markers", f"{tier}: tier (tests/conftest.py: applied by location and fixtures)")
    config.addinivalue_line("markers", "quiet: a latency claim; runs with no other test of the run (quiet_machine)")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _own_state_base(worker)
        return
    if not os.environ.get(_RUN_ENV):  # the controller (or a run without workers): workers inherit it
        os.environ[_RUN_ENV] = uuid.uuid4().hex[:8]
    if not getattr(config.option, "numprocesses", None):  # no workers: this process runs the tests
        global _SOLO_BASE
        _SOLO_BASE = _own_state_base(SOLO)  # so another run, or a user's kernel, is not seen


def pytest_itemcollected(item):
    """Tier markers, put on as each test is collected (so ``-m`` sees them)."""
    for tier in sorted(_tiers_of(item) - {t for t in TIERS if item.get_closest_marker(t)}):
        item.add_marker(getattr(pytest.mark, tier))


def _xdist_scope(nodeid: str) -> str:
    """The unit xdist hands to one worker: a test's module (so its shared kernels start
    once), or its machine-wide tier's name.  By location, as the tiers are."""
    path = nodeid.split("::")[0].split("@")[0]
    rel = path.removeprefix("tests/")
    return next((tier for tier in _MACHINE_WIDE
                 if any(rel == p or rel.startswith(p + "/") for p in _TIER_PATHS[tier])), path)


def pytest_xdist_make_scheduler(config, log):
    """With ``-n``: whole modules (and whole machine-wide tiers) per worker, as
    ``--dist loadscope`` would do by module (xdist's ``loadgroup`` marks are lost on pytest 9),
    handed out in collection order (:func:`pytest_collection_modifyitems`: heaviest first)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _xdist_scope(nodeid)

    config.option.loadscopereorder = False  # xdist's own order: most tests first (soak, 2 tests, last)
    return ByModule(config, log)


#: Which work goes first, so two workers end together: the long runs, then modules of
#: real kernels (those with more of them first), then the many short modules of ``fast``.
_RANK = {"soak": 0, "browser": 1, "nonroot": 2, "sandbox": 3, "live": 4, "fast": 5}


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(config, items):
    weight: dict[str, list[int]] = {}
    for item in items:
        rank = min((_RANK[m.name] for m in item.iter_markers() if m.name in _RANK), default=_RANK["fast"])
        w = weight.setdefault(_xdist_scope(item.nodeid), [rank, 0])
        w[0] = min(w[0], rank)
        w[1] -= rank <= _RANK["sandbox"]
    items.sort(key=lambda item: tuple(weight[_xdist_scope(item.nodeid)]))  # stable: a module keeps its order


@pytest.fixture(scope="session")
def _fast_tier_state(tmp_path_factory) -> Path:
    from sandbox_kernel.backends.local.layout import state_base

    state = tmp_path_factory.mktemp("fast-tier-sandbox-state")
    state.chmod(0o700)
    jedi = state_base() / "jedi-cache"  # ``install`` builds it where it is missing (~15 s)
    if jedi.is_dir():
        (state / "jedi-cache").symlink_to(jedi)
    return state


#: Machine-wide caches, not sandboxes: runsc's probe (``runsc do /bin/true``, once) and
#: the completion cache ``sandbox-kernel install`` builds.
_CACHES = ("runsc-probe-", "jedi-cache")


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_sandbox(request, monkeypatch):
    """``fast`` tests share a sandbox state directory of their own where nothing but
    the machine-wide caches may appear: a test that starts a sandbox without a sandbox fixture
    fails here, naming what it made; its module then says ``pytestmark = pytest.mark.sandbox``."""
    if not request.node.get_closest_marker("fast"):
        yield
        return
    state = request.getfixturevalue("_fast_tier_state")
    before, names = state.stat().st_mtime_ns, {p.name for p in state.iterdir()}
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(state))
    yield
    after = {p.name for p in state.iterdir()}
    made = sorted(n for n in after - names if not n.startswith(_CACHES))
    if made or (state.stat().st_mtime_ns != before and after == names):
        pytest.fail(f"a fast-tier test used the sandbox state directory (made {made or 'entries it removed'}):"
                    " it starts sandboxes; mark its module sandbox (tests/conftest.py: tiers)", pytrace=False)


# ---- quiet: a test whose claim is a latency runs with the machine to itself ----------------
#
# Case C16 asks for a reply within 500 ms of a fresh kernel's first request.  With two
# workers, the other one's sandboxes (a notebook, a template build) took the cores and the
# same reply came in 0.8 s: the suite's own load, which no user's machine has.  A test marked
# ``quiet`` (its ``quiet_machine`` fixture) holds the run's quiet lock exclusively; every
# other test holds it shared while it runs, so the quiet test starts once the other
# worker's current test has ended, and that worker waits until it is over.  A turnstile
# makes the exclusive request fair: taken first, it stops new shared holders.


def _quiet_paths() -> tuple[Path, Path]:
    base = Path(tempfile.gettempdir()) / f"sandbox-kernel-tests-{os.environ.get(_RUN_ENV, 'solo')}"
    return base.with_suffix(".turnstile"), base.with_suffix(".quiet")


@contextlib.contextmanager
def _quiet_lock(exclusive: bool) -> Iterator[None]:
    turnstile, quiet = _quiet_paths()
    with open(turnstile, "a") as gate, open(quiet, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _machine_shared(request) -> Iterator[None]:
    """Every test but a ``quiet`` one holds the quiet lock shared while it runs."""
    if request.node.get_closest_marker("quiet"):
        yield
        return
    with _quiet_lock(exclusive=False):
        yield


@pytest.fixture
def quiet_machine() -> Iterator[None]:
    """The machine to this test alone among the run's tests (mark the test ``quiet`` too)."""
    with _quiet_lock(exclusive=True):
        yield


_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def _mtime(d) -> float:
    try:
        return d.stat().st_mtime
    except OSError:
        return 0.0


#: Names this run's worker state bases apart from those of another run on the machine.
_RUN_ENV = "SANDBOX_KERNEL_TEST_RUN"
#: The worker name of a run without xdist workers (its own state base, as a worker's).
SOLO = "solo"
_SOLO_BASE: Path | None = None


def _worker_bases() -> list[Path]:
    """The state bases of this run's xdist workers (see :func:`_own_state_base`)."""
    from sandbox_kernel.backends.local.layout import state_base

    run = os.environ.get(_RUN_ENV)
    if not run:
        return []
    default = state_base()
    return sorted(default.parent.glob(f"{default.name}-{run}-gw*"))


def _own_state_base(worker: str) -> Path:
    """Each xdist worker gets its own sandbox state base (``<default>-<run>-gw0``...), set before
    any kernel starts, so its kernels inherit it: admission, ``gc``, the pool socket and
    the leak check each see one worker's sandboxes only.  The completion cache is the
    machine's (linked, as ``install`` built it); what else lives there (runsc's probe,
    the statx shim, start templates) is made again per worker."""
    from sandbox_kernel.backends.local.layout import state_base

    default = state_base()
    base = default.with_name(f"{default.name}-{os.environ[_RUN_ENV]}-{worker}")
    os.environ["SANDBOX_KERNEL_STATE_DIR"] = str(base)
    state_base()  # made with the default base's mode and checks
    if (default / "jedi-cache").is_dir():
        (base / "jedi-cache").symlink_to(default / "jedi-cache")
    return base


def _leaked(base: Path | None) -> list[Path]:
    """State dirs under ``base`` (default: this process's) whose proxy is gone, made by this run."""
    from sandbox_kernel.backends.local.reaper import orphans

    saved = os.environ.get("SANDBOX_KERNEL_STATE_DIR")
    if base is not None:
        os.environ["SANDBOX_KERNEL_STATE_DIR"] = str(base)
    try:  # a directory without a tag (its owner died before writing it) counts by its mtime
        return [d for d, tag in orphans() if (tag.get("created_at") or _mtime(d)) >= _SESSION_START]
    finally:
        if base is not None:
            os.environ.pop("SANDBOX_KERNEL_STATE_DIR", None)
            if saved is not None:
                os.environ["SANDBOX_KERNEL_STATE_DIR"] = saved


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a test left a sandbox behind (state dir whose proxy is gone), or if
    the whole run took longer than :data:`SUITE_BUDGET_MIN`.  Under xdist the controller
    judges every worker's state base once the workers are done, then removes them."""
    from sandbox_kernel.backends.local.pool import spares

    spares.stop_all()  # the spare pools this process's kernels started (a worker's own base)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    bases: list[Path | None] = [None, *_worker_bases()]
    deadline = time.time() + 15  # watchdogs reap asynchronously
    while True:
        leaked = [d for b in bases for d in _leaked(b)]
        if not leaked or time.time() > deadline:
            break
        time.sleep(0.5)
    if leaked:
        print(f"\nleaked sandboxes (state dirs whose proxy is gone): {[str(d) for d in leaked]}")
        session.exitstatus = 1
    else:
        for b in bases[1:]:
            shutil.rmtree(b, ignore_errors=True)
        if _SOLO_BASE is not None:
            shutil.rmtree(_SOLO_BASE, ignore_errors=True)
    took = (time.time() - _SESSION_START) / 60
    if took > SUITE_BUDGET_MIN:
        slowest = sorted(_DURATIONS.items(), key=lambda kv: -kv[1])[:15]
        print(f"\nthe tests took {took:.1f} min, over the suite's budget of {SUITE_BUDGET_MIN:.0f} min "
              "(tests/conftest.py); the slowest:\n" + "\n".join(f"  {d:7.1f} s  {n}" for n, d in slowest))
        session.exitstatus = 1
