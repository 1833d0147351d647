"""Snapshot, rewind and fork of a kernel on E2B: the SDK's own calls, the agent reattached.

E2B copies a whole microVM, memory, files and processes: ``create_snapshot`` keeps one
under an id that a new sandbox is created from (``AsyncSandbox.create(template=<id>)``),
``fork(count)`` starts ``count`` running copies.  What differs from a local gVisor copy,
as E2B documents it:

* **streams dropped.**  A copy's processes run on, the agent among them, but none of
  the source's command streams comes with it.  So a copy's kernel reattaches to its agent
  by pid (``commands.connect``), as after a pause (:meth:`E2BBackend._reattach`).
* **the source briefly paused.**  The source is checkpointed in place, and its own streams
  drop too: its relay reattaches and asks the agent to replay what the cut lost
  (:meth:`E2BBackend.reconnect`, the path of a cut connection); the cell that ran goes on.
* **kept by E2B.**  A snapshot lives in the E2B account (it survives the sandbox), so it is
  deleted (``delete_snapshot``) when the proxy drops it or shuts down; a fork not started
  yet is a running sandbox, killed at the source's shutdown, else ended by its timeout
  (``deadman_s``).  ``sandbox-kernel gc`` does not list E2B's account.

A copy is then made its own as a local one is (:mod:`.local.snapshots`): the cell of then
interrupted, the interpreter reseeded (:func:`.local.template.reseed`), its agent numbering
its frames on from the source's.  Hand-offs to a fork's proxy are the local backend's
(:mod:`.local.forks`: a private directory under this user's snapshots, ``fork.json``), whose
"image" names the running E2B fork (``e2b.json``: its sandbox id and the agent's pid).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SandboxStartError, SnapshotError
from ..protocol import host_op_frame
from .local import forks as local_forks
from .local import snapshots as local_snapshots
from .local.template import reseed

if TYPE_CHECKING:
    from ..policy import Policy

#: Most forks one ``Sandbox.fork(count)`` call starts (the SDK's bound).
E2B_MAX_FORKS = 20
#: What a hand-off's "image" holds: the running fork's sandbox id and the agent's pid.
RECORD = "e2b.json"
#: Longest the shutdown waits for E2B to delete snapshots and kill forks nobody took, s.
CLEANUP_WAIT_S = 15.0


def from_first_frame(data: bytes) -> bytes:
    """``data`` from its first whole frame on (a line holding a JSON object), or from a line
    still arriving at its end.  A copy's stream is attached while its agent may be writing (the
    cell of then runs on until the interrupt), so it may begin mid-line; the relay's channel,
    opened anew for the copy, would take that partial line for a corrupt stream."""
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        try:
            if isinstance(json.loads(data[start:end]), dict):
                return data[start:]
        except ValueError:
            pass
        start = end + 1
    return data[start:]


class _Chunks:
    """The backend's stdout chunks as :func:`.local.template.reseed` reads a stream."""

    def __init__(self, read: Any):
        self._read = read

    async def read(self, n: int) -> bytes:
        return await self._read()


class E2BCopies(local_forks.ForkOrigin):
    """``E2BBackend``'s snapshot, rewind and fork verbs (:class:`~.base.SandboxBackend`'s),
    mixed in; see the module docstring."""

    if TYPE_CHECKING:  # what E2BBackend gives the verbs
        policy: Policy
        kernel_id: str
        fork_from: str
        deadman_s: float
        log: logging.Logger
        _sbx: Any
        _pid: int | None
        _pending: bytes
        _copying: bool
        #: This kernel's snapshots: our id -> (E2B's snapshot id, the agent's pid in it).
        _e2b_snaps: dict[str, tuple[str, int]]

        def _opts(self) -> dict: ...
        async def _open_sandbox(self, template: str | None = None, sandbox_id: str | None = None) -> None: ...
        async def _reattach(self) -> None: ...
        async def read(self) -> bytes: ...
        async def write(self, data: bytes) -> None: ...
        def _map_copy_error(self, err: BaseException, doing: str) -> SnapshotError: ...

    def snapshot_refusal(self) -> str | None:
        return None

    def fork_refusal(self) -> str | None:
        return None

    def admit_forks(self, n: int) -> None:
        """Refuse more forks than one E2B ``fork`` call starts (:data:`E2B_MAX_FORKS`); E2B's
        own quota (concurrent sandboxes) answers per fork, named in the error."""
        if n > E2B_MAX_FORKS:
            raise SnapshotError(f"{n} forks refused: E2B starts at most {E2B_MAX_FORKS} in one fork call",
                                "ForkRefused")

    def _running(self, what: str) -> Any:
        if self._sbx is None or self._pid is None:
            raise SnapshotError(f"no E2B sandbox is running: nothing to {what}")
        return self._sbx

    async def snapshot(self, snapshot_id: str) -> int:
        """``create_snapshot`` of the running sandbox (E2B pauses it briefly; its stream is
        reattached and replayed by the relay); 0 bytes here (E2B keeps it, not this disk).

        Raises
        ------
        SnapshotError
            ``SnapshotFailed``: E2B refused (the message names its error); the sandbox goes on.
        """
        sbx, pid = self._running("snapshot"), self._pid
        assert pid is not None
        self._copying = True
        try:
            info = await sbx.create_snapshot(**self._opts())
        except Exception as err:
            raise self._map_copy_error(err, "snapshot the sandbox") from err
        self._e2b_snaps[snapshot_id] = (str(info.snapshot_id), pid)
        self.log.info("E2B snapshot %s of sandbox %s kept as %s", info.snapshot_id, sbx.sandbox_id, snapshot_id)
        return 0

    async def restore_snapshot(self, snapshot_id: str, *, interrupt: bool = False) -> None:
        """A new E2B sandbox created from the snapshot (the running one already killed by
        the relay), the agent reattached by pid, the cell of then interrupted, reseeded.

        Raises
        ------
        SnapshotError
            ``UnknownSnapshot`` (nothing touched), or E2B failed (the sandbox is gone).
        """
        found = self._e2b_snaps.get(snapshot_id)
        if found is None:
            raise SnapshotError(f"no snapshot {snapshot_id!r} of this kernel (never taken, or removed)",
                                "UnknownSnapshot")
        e2b_id, pid = found
        await self._open_sandbox(template=e2b_id)
        await self._own_copy(pid, interrupt)
        self.log.info("E2B sandbox %s created from snapshot %s", self._sbx.sandbox_id, snapshot_id)

    async def _own_copy(self, pid: int, interrupt: bool) -> None:
        """Reattach to the copy's agent (``pid``), interrupt the cell of then, reseed."""
        self._pid = pid
        await self._reattach()
        if interrupt:  # before the reseed, whose completer warm-up would wait for the cell
            await self.write(host_op_frame("interrupt"))
        got = await reseed(_Chunks(self.read), self.write, self.log,  # type: ignore[arg-type]
                           str(self._sbx.sandbox_id))
        self._pending = from_first_frame(got)

    async def fork(self, fork_id: str, n: int, meta: dict[str, Any]) -> tuple[list[str], int]:
        """``fork(count=n)`` of the running sandbox (paused briefly; its stream reattached and
        replayed by the relay), each fork handed over in a hand-off directory; 0 bytes here.

        Raises
        ------
        SnapshotError
            E2B refused, or started fewer than ``n`` (those it started are killed): the
            source goes on.
        """
        sbx = self._running("fork")
        self._copying = True
        try:
            results = await sbx.fork(count=n, timeout=int(self.deadman_s), **self._opts())
        except Exception as err:
            raise self._map_copy_error(err, f"fork the sandbox {n} time(s)") from err
        started = [r for r in results if not isinstance(r, Exception)]
        failed = [r for r in results if isinstance(r, Exception)]
        try:
            if failed:
                raise self._map_copy_error(failed[0], f"start {len(failed)} of {n} forks")
            handoffs = await asyncio.to_thread(self._handoffs, fork_id, meta, [s.sandbox_id for s in started])
        except BaseException:
            await asyncio.gather(*(s.kill(**self._opts()) for s in started), return_exceptions=True)
            raise
        self.log.info("E2B sandbox %s forked into %s", sbx.sandbox_id, ", ".join(s.sandbox_id for s in started))
        return handoffs, 0

    def _handoffs(self, fork_id: str, meta: dict[str, Any], sandbox_ids: list[str]) -> list[str]:
        made: list[Path] = []
        try:
            for i, sid in enumerate(sandbox_ids):
                d = local_snapshots.new_dir(self.kernel_id, f"fork-{fork_id}-{i}")
                made.append(d)
                (d / "image").mkdir(mode=0o700)
                (d / "image" / RECORD).write_text(json.dumps({"sandbox_id": sid, "pid": self._pid}))
                (d / local_forks.META).write_text(json.dumps(meta))
        except BaseException:
            for d in made:
                shutil.rmtree(d, ignore_errors=True)
            raise
        return [str(d) for d in made]

    async def _start_fork(self) -> None:
        """Adopt the running E2B fork this kernel's hand-off names (``fork_from``): connect,
        reattach to its agent, interrupt the source's cell of then, reseed; the hand-off is
        removed, used or not.  Called by ``start`` once.

        Raises
        ------
        SandboxStartError
            The hand-off cannot be used, or the fork is gone (its timeout passed): this
            kernel has no state of its source.
        """
        handoff, self.fork_from = Path(self.fork_from), ""
        try:
            image, meta = await local_forks.checked_handoff(handoff, self.fork_refusal())
            try:
                rec = json.loads((image / RECORD).read_text())
                sid, pid = str(rec["sandbox_id"]), int(rec["pid"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise SandboxStartError(f"the fork's hand-off names no E2B sandbox ({err})") from err
        finally:
            await asyncio.to_thread(shutil.rmtree, handoff, True)
        await self._open_sandbox(sandbox_id=sid)
        await self._own_copy(pid, bool(meta.get("busy")))
        self.fork_of, self._copy = local_forks.fork_record(meta)
        self.log.info("E2B sandbox %s adopted as fork %s of kernel %s", sid, self.fork_of["fork_id"],
                      self.fork_of["source_kernel"])

    def remove_snapshots(self, snapshot_ids: list[str] | None = None) -> None:
        """Delete these snapshots from E2B (None: all, and kill the forks whose hand-off no
        proxy took: the shutdown, which waits up to :data:`CLEANUP_WAIT_S`)."""
        snaps = self._e2b_snaps
        ids = list(snaps) if snapshot_ids is None else [s for s in snapshot_ids if s in snaps]
        doomed = [snaps.pop(s)[0] for s in ids]
        forks: list[str] = []
        if snapshot_ids is None:
            for rec in sorted(local_snapshots.kernel_dir(self.kernel_id).glob(f"fork-*/image/{RECORD}")):
                try:
                    forks.append(str(json.loads(rec.read_text())["sandbox_id"]))
                except (OSError, ValueError, KeyError):
                    continue
            local_snapshots.remove(self.kernel_id, None)
        if not (doomed or forks):
            return
        worker = threading.Thread(target=self._cleanup, args=(doomed, forks), name="e2b-cleanup")
        worker.start()
        if snapshot_ids is None:
            worker.join(CLEANUP_WAIT_S)

    def _cleanup(self, snapshots: list[str], sandboxes: list[str]) -> None:
        import e2b  # the SDK's blocking calls: off the loop, also at shutdown

        opts = {**self._opts(), "request_timeout": min(self._opts()["request_timeout"], 10.0)}
        for sid in snapshots:
            try:
                e2b.Sandbox.delete_snapshot(sid, **opts)
            except Exception as err:  # noqa: BLE001
                self.log.warning("could not delete E2B snapshot %s (%s): delete it in E2B's dashboard", sid, err)
        for sid in sandboxes:
            try:
                e2b.Sandbox.kill(sid, **opts)
            except Exception as err:  # noqa: BLE001
                self.log.warning("could not kill E2B fork %s nobody started (%s); its timeout ends it", sid, err)
