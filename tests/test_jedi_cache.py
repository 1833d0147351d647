"""The host-built jedi cache (C16): built once per interpreter, immutable, bound read-only.

Builds run jedi on the host on standard-library snippets only (no cell code);
each test builds into its own directory.  The end-to-end checks, through
kernels on both runtimes, are ``test_cases.py::test_c16_*``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from sandbox_kernel.backends.local import jedi_cache

#: A small build: one module, ~2 s.
SNIPPETS = ("import json; json.",)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("jedi-cache")
    new = jedi_cache.build(sys.executable, root, snippets=SNIPPETS)
    assert new is not None
    return root, new


def test_build_is_current_readable_and_names_each_source(built):
    root, new = built
    base = jedi_cache.cache_dir(sys.executable, root)
    assert new.parent == base and os.readlink(base / "current") == new.name
    manifest = json.loads((new / "manifest.json").read_text())
    files = manifest["files"]
    assert any(src.endswith(os.path.join("json", "__init__.py")) for src in files.values())
    for rel in files:
        pickle = new / rel
        assert pickle.is_file() and pickle.stat().st_mode & 0o777 == 0o644
        assert not os.path.isabs(rel) and ".." not in rel.split(os.sep)
    for d in (base.parent, base, new, *{(new / rel).parent for rel in files}):
        assert d.stat().st_mode & 0o777 == 0o755  # the sandbox user reads it through a bind
    assert jedi_cache.stale_entries(new) == 0


def test_build_has_matplotlibs_font_list_and_an_older_build_is_stale(built):
    import matplotlib
    from matplotlib import font_manager

    _, new = built
    manifest = json.loads((new / "manifest.json").read_text())
    assert manifest["matplotlib"] == matplotlib.__version__
    fontlist = new / "matplotlib" / f"fontlist-v{font_manager.FontManager.__version__}.json"
    assert fontlist.stat().st_mode & 0o777 == 0o644
    assert any(f["name"] == "DejaVu Sans" for f in json.loads(fontlist.read_text())["ttflist"])
    older = new.parent / "b-older"
    older.mkdir()
    (older / "manifest.json").write_text(json.dumps({"files": {}}))  # no "matplotlib": made before
    assert jedi_cache.stale_entries(older) == 1


def test_seed_returns_the_current_build(built):
    root, new = built
    assert jedi_cache.seed(sys.executable, root, build_missing=False) == str(new)


def test_each_interpreter_path_has_its_own_key(tmp_path):
    link = tmp_path / "python"
    link.symlink_to(os.path.realpath(sys.executable))  # a venv's python: same binary, other path
    assert jedi_cache.cache_dir(str(link), tmp_path) != jedi_cache.cache_dir(sys.executable, tmp_path)


def test_missing_or_stale_build_starts_one_in_the_background(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(jedi_cache, "_build_in_background", lambda python, root: started.append(python))
    assert jedi_cache.seed(sys.executable, tmp_path) is None  # none yet
    assert started == [sys.executable]
    # a build whose source changed since: still used (the bootstrap skips the entry), rebuilt
    base = jedi_cache.cache_dir(sys.executable, tmp_path)
    b = base / "b-1-1"
    (b / "V").mkdir(parents=True)
    src = tmp_path / "src.py"
    src.write_text("x = 1\n")
    (b / "V" / "x.pkl").write_bytes(b"")
    os.utime(b / "V" / "x.pkl", (1000, 1000))
    (b / "manifest.json").write_text(json.dumps({"files": {"V/x.pkl": str(src)}, "matplotlib": None}))
    os.symlink(b.name, base / "current")
    assert jedi_cache.stale_entries(b) == 1
    os.utime(b, (1000, 1000))  # built long ago
    started.clear()
    assert jedi_cache.seed(sys.executable, tmp_path) == str(b)
    assert started == [sys.executable]
    os.utime(b)  # built just now: not again within REBUILD_INTERVAL_S
    started.clear()
    assert jedi_cache.seed(sys.executable, tmp_path) == str(b) and started == []


def test_superseded_builds_stay_while_a_sandbox_may_hold_them(tmp_path):
    base = jedi_cache.cache_dir(sys.executable, tmp_path)
    old, new, older = base / "b-1-1", base / "b-2-1", base / "b-0-1"
    for d in (old, new, older):
        d.mkdir(parents=True)
    jedi_cache._make_current(base, old)
    jedi_cache._make_current(base, new)  # old: superseded just now
    long_ago = time.time() - jedi_cache.KEEP_SUPERSEDED_S - 60
    os.utime(older, (long_ago, long_ago))
    jedi_cache._remove_superseded(base)
    assert new.is_dir() and old.is_dir() and not older.exists()
    assert os.readlink(base / "current") == new.name


def test_a_second_build_while_one_runs_returns_at_once(tmp_path):
    import fcntl

    base = jedi_cache.cache_dir(sys.executable, tmp_path)
    base.mkdir(parents=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.monotonic()
        assert jedi_cache.build(sys.executable, tmp_path, snippets=SNIPPETS) is None
        assert time.monotonic() - t0 < 1
