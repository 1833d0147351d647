"""The E2B code-interpreter quick-start flow, through :class:`sandbox_kernel.Sandbox`.

A plain module (``from client_flow import quickstart_flow``) shared by the
client's tests on every backend and through a Jupyter Server.  Every cell runs
inside a sandbox; nothing here executes cell code on the host.
"""

from __future__ import annotations

import io

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def quickstart_flow(sbx) -> None:
    """start (done by the caller), ``x = 1``, ``x + 1``, a frame, a figure, ``1/0``, a timeout."""
    ex = sbx.run("x = 1")
    assert ex.error is None and ex.results == [] and ex.done, ex
    ex = sbx.run("x + 1")
    assert ex.results[0].text == "2", ex
    assert ex.results[0].is_main_result and ex.text == "2" and isinstance(ex.execution_count, int)
    ex = sbx.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['u', 'v']})")
    assert ex.error is None, ex.error
    assert "text/html" in ex.results[0].formats and "<table" in ex.results[0].html, ex.results
    ex = sbx.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()")
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1 and pngs[0].startswith(PNG_MAGIC), ex.results
    from PIL import Image  # matplotlib's dependency: the bytes decode as an image

    img = Image.open(io.BytesIO(pngs[0]))
    img.load()
    assert img.size[0] > 100 and img.size[1] > 100, img.size
    ex = sbx.run("1/0")
    assert ex.error is not None and ex.error.ename == "ZeroDivisionError", ex
    assert ex.error.evalue == "division by zero"
    assert any("ZeroDivisionError" in line for line in ex.error.traceback)
    assert not any("\x1b[" in line for line in ex.error.traceback)
    assert any("\x1b[" in line for line in ex.error.traceback_ansi)
    ex = sbx.run("import time; time.sleep(10)", timeout=2)
    assert ex.error is not None and ex.error.ename == "TimeoutError" and ex.error.timed_out, ex
    assert "interrupted" in ex.error.evalue
    assert sbx.run("x").results[0].text == "1"


def files_flow(sbx, tmp_path) -> None:
    """Upload, list, stat, use in a cell, download, remove, sync, and the refusals, through the
    kernel's file comm."""
    import hashlib
    import os

    import pytest

    blob = os.urandom(3 * 1024 * 1024 + 17)  # several chunks, not a multiple of one
    src = tmp_path / "blob.bin"
    src.write_bytes(blob)
    done = sbx.upload(src, "blob.bin")
    assert done["size"] == len(blob) and done["sha256"] == hashlib.sha256(blob).hexdigest(), done
    entries = {e["name"]: e for e in sbx.list_files(".")}
    assert entries["blob.bin"]["type"] == "file" and entries["blob.bin"]["size"] == len(blob), entries
    ex = sbx.run("import hashlib; print(hashlib.sha256(open('blob.bin', 'rb').read()).hexdigest())")
    assert ex.stdout.strip() == hashlib.sha256(blob).hexdigest(), ex
    assert sbx.run("open('made.txt', 'w').write('from the cell')").error is None
    assert sbx.download("made.txt") == b"from the cell"
    assert sbx.download("blob.bin") == blob
    with pytest.raises(ValueError, match="at most 10 are read"):
        sbx.download("blob.bin", max_bytes=10)
    with pytest.raises(FileNotFoundError):
        sbx.download("no-such-file")
    with pytest.raises((PermissionError, ValueError)):
        sbx.upload(b"x", "/etc/passwd")
    with pytest.raises((PermissionError, ValueError)):
        sbx.download("../../../../etc/shadow")
    st = sbx.stat("blob.bin")
    assert st["type"] == "file" and st["size"] == len(blob) and st["path"].endswith("/blob.bin"), st
    assert sbx.remove("made.txt")["removed"] == "file"
    with pytest.raises(FileNotFoundError):
        sbx.stat("made.txt")
    with pytest.raises(FileNotFoundError):
        sbx.remove("made.txt")
    assert isinstance(sbx.sync()["files"], list)  # nothing to copy back here: mounted, or no workspace


def stop_process(proc, timeout_s: float = 30) -> None:
    """Terminate a server the test started (SIGTERM: it shuts its kernels down), then kill it."""
    import contextlib
    import subprocess

    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
    if proc.poll() is None:
        proc.kill()
