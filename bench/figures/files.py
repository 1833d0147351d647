"""File transfer through the ``sandbox_kernel.files`` comm, beside a plain host ``cp``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from bench.figures._registry import Figure, register
from bench.harness import Context

#: Bytes moved per sample (the issue's 20 MiB).
SIZE = 20 << 20
MIB = 1 << 20


def fig_files(ctx: Context, n: int) -> dict[str, list[float]]:
    """Upload then download :data:`SIZE` random bytes ``n`` times on the shared kernel,
    through a client of its own (:func:`sandbox_kernel.files_client.own_client`)."""
    from sandbox_kernel import files_client

    s = ctx.session
    kc = files_client.own_client(s.km)
    data = os.urandom(SIZE)
    up, down = [], []
    try:
        with files_client.FilesClient(kc, timeout=300) as fc:
            fc.upload("bench.bin", data)  # warm-up
            for _ in range(n):
                t0 = time.perf_counter()
                fc.upload("bench.bin", data)
                up.append(SIZE / MIB / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                back = fc.download("bench.bin")
                down.append(SIZE / MIB / (time.perf_counter() - t0))
                if back != data:
                    raise RuntimeError("the downloaded bytes differ from the uploaded ones")
            fc.remove("bench.bin")
    finally:
        kc.stop_channels()
    return {"files_upload_mibps": up, "files_download_mibps": down}


def fig_cp(ctx: Context, n: int) -> list[float]:
    """``cp`` of :data:`SIZE` random bytes between two host temporary directories (the
    file is in the page cache, as the sandbox's are: memory to memory)."""
    src_dir, dst_dir = tempfile.mkdtemp(prefix="bench-cp-"), tempfile.mkdtemp(prefix="bench-cp-")
    try:
        src = os.path.join(src_dir, "f.bin")
        with open(src, "wb") as f:
            f.write(os.urandom(SIZE))
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(["cp", src, os.path.join(dst_dir, "f.bin")], check=True)
            out.append(SIZE / MIB / (time.perf_counter() - t0))
        return out
    finally:
        shutil.rmtree(src_dir, ignore_errors=True)
        shutil.rmtree(dst_dir, ignore_errors=True)


SANDBOXES = ("bubblewrap", "gvisor", "e2b-emulated", "modal-emulated")

register("files_upload_mibps", Figure(
    "File comm upload, 20 MiB", "MiB/s", fig_files, n=5, n_quick=2, higher_is_better=True,
    targets=SANDBOXES, rounds=1,
    note="`files_client.FilesClient.upload` of 20 MiB of random bytes: comm messages on the "
         "control channel with 1 MiB binary buffers, base64 frames to the agent, written and "
         "SHA-256 checked inside, renamed into place (docs/files.md)."))
register("files_download_mibps", Figure(
    "File comm download, 20 MiB", "MiB/s", None, n=0, n_quick=0, higher_is_better=True,
    produced_by="files_upload_mibps", targets=SANDBOXES,
    note="`FilesClient.download` of the same file: the agent's base64 frames, checked in order "
         "and against its size and SHA-256 by the proxy, then IOPub comm_msg buffers, checked "
         "again by the client."))
register("files_host_cp_mibps", Figure(
    "Plain host cp, 20 MiB", "MiB/s", fig_cp, n=5, n_quick=2, higher_is_better=True,
    targets=("stock",), rounds=1,
    note="`cp` of the same size between two host temporary directories: the host's own "
         "file copy, the ceiling beside which the comm's rates read."))
