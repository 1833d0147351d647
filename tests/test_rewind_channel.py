"""The host's side of a rewind (issue 30), without a sandbox (fast tier): the frame numbers of
an agent restored from a snapshot, the stale messages of the requests of before, and the
snapshot handlers' refusals that touch nothing.  ``tests/test_snapshots.py`` runs the same
on real gVisor kernels.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from fakes.backend import jupyter_msg
from fakes.host import RecordingHost, request
from sandbox_kernel import protocol
from sandbox_kernel.inflight import InFlight
from sandbox_kernel.snapshots import Snapshots

log = logging.getLogger("test_rewind_channel")


def test_an_agent_restored_from_a_snapshot_numbers_on_from_where_it_was():
    seq = protocol.FrameSequence()
    seq.reset()
    with pytest.raises(protocol.ChannelCorrupted):  # a new sandbox numbers from 1
        seq.admit(57)
    seq.reset(rebase=True)  # restored from a snapshot: the agent's counter was at 56 (or more)
    assert seq.admit(57) and seq.admit(58) and seq.last == 58
    with pytest.raises(protocol.ChannelCorrupted):  # then strict again
        seq.admit(60)


def _frame(channel: str, msg_type: str, parent_id: str, content: dict | None = None) -> protocol.AgentFrame:
    msg = jupyter_msg(msg_type, content or {}, {"msg_id": parent_id, "msg_type": "execute_request"})
    return protocol.validate_agent_frame({"seq": 1, "op": "msg", "channel": channel, "msg": msg})


def test_what_the_rewound_interpreter_sends_for_requests_of_before_is_dropped():
    async def go() -> tuple[RecordingHost, list[str]]:
        host, corrupt = RecordingHost(), []
        flight = InFlight(host, corrupt.append, log)
        flight.begin_rewound()
        # the cell that ran when the snapshot was taken: its output, its reply to the interrupt
        flight.route(_frame("iopub", "stream", "old-cell", {"name": "stdout", "text": "tick"}))
        flight.route(_frame("shell", "execute_reply", "old-cell", {"status": "error"}))
        flight.route(_frame("iopub", "status", "old-cell", {"execution_state": "idle"}))
        parent = request("x")
        p = flight.add(parent, [], True)  # a request after the rewind goes through as always
        flight.route(_frame("iopub", "stream", p.msg_id, {"name": "stdout", "text": "new"}))
        flight.route(_frame("shell", "execute_reply", p.msg_id, {"status": "ok"}))
        assert p.reply.done()
        return host, corrupt

    host, corrupt = asyncio.run(go())
    assert corrupt == []  # a reply for a request of before is no corruption
    assert [m for m, _ in host.iopub] == ["stream"] and host.iopub[0][1] is not None


def test_a_threads_output_of_before_is_published_with_no_parent_once_the_copy_settled():
    """ipykernel parents a thread's output to the last request its interpreter handled: in a
    copy (a fork, a rewind) one of before, or the settle probe of the proxy's own.  Once the
    cell of before has ended, that output goes out with no parent; everything else of
    before is still dropped."""

    async def go() -> tuple[RecordingHost, list, list[str]]:
        host, corrupt, seen = RecordingHost(), [], []
        host.on_iopub = lambda frame, pending: seen.append((frame.msg_type, frame.msg["parent_header"], pending))
        flight = InFlight(host, corrupt.append, log)
        flight.begin_rewound()  # a cell of before may still print: nothing of before passes
        flight.route(_frame("iopub", "stream", "old-cell", {"name": "stdout", "text": "cell"}))
        probe = flight.add(request("", "is_complete_request"), [], True, own=True)
        flight.route(_frame("iopub", "stream", probe.msg_id, {"name": "stdout", "text": "tick"}))
        flight.route(_frame("shell", "is_complete_reply", probe.msg_id, {"status": "complete"}))
        flight.settled()
        flight.route(_frame("iopub", "stream", "old-cell", {"name": "stdout", "text": "tick"}))
        flight.route(_frame("iopub", "display_data", "old-cell", {"data": {}, "metadata": {}}))
        for kind in ("error", "execute_result", "status"):  # a cell's, not a thread's: dropped
            flight.route(_frame("iopub", kind, "old-cell", {"execution_state": "idle"}))
        flight.route(_frame("shell", "execute_reply", "old-cell", {"status": "error"}))
        return host, seen, corrupt

    host, seen, corrupt = asyncio.run(go())
    assert corrupt == []
    assert seen == [("stream", {}, None), ("stream", {}, None), ("display_data", {}, None)]

    async def fork_idle() -> list:  # a fork of an idle kernel: nothing to wait for
        host, seen = RecordingHost(), []
        host.on_iopub = lambda frame, pending: seen.append((frame.msg_type, frame.msg["parent_header"], pending))
        flight = InFlight(host, lambda what: None, log)
        flight.begin_rewound(settled=True)
        flight.route(_frame("iopub", "stream", "source-cell", {"name": "stdout", "text": "tick"}))
        return seen

    assert asyncio.run(fork_idle()) == [("stream", {}, None)]


class _Face:
    """A kernel face with a backend that refuses (a bubblewrap kernel) and a relay that
    records what is asked of it (nothing, for a refusal)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        face = self

        class Backend:
            def snapshot_refusal(self) -> str:
                return "the bubblewrap runtime has no checkpoint"

            def remove_snapshots(self, ids: Any = None) -> None:
                face.asked.append("remove")

        class Relay:
            pending: dict = {}

            async def snapshot(self, take: Any) -> int:
                face.asked.append("snapshot")
                return 0

            async def rewind(self, *a: Any, **k: Any) -> None:
                face.asked.append("rewind")

        self.sandbox, self.relay, self.config_error = Backend(), Relay(), None

    async def on_main_loop(self, coro: Any) -> Any:
        return await coro


def test_refusals_touch_nothing_and_one_operation_runs_at_a_time():
    face = _Face()
    snaps = Snapshots(face, max_kept=2)  # type: ignore[arg-type]

    async def go() -> list[dict]:
        out = [await snaps.run_one("snapshot", snaps.take), await snaps.run_one("restore", lambda: snaps.rewind("x"))]
        snaps._under_way = "restore"  # a restore under way: the next is refused at once
        ran = []

        async def op() -> dict:
            ran.append(1)
            return {}
        out.append(await snaps.run_one("restore", op))
        assert ran == []
        return out

    took, restored, busy = asyncio.run(go())
    assert took["status"] == "error" and took["ename"] == "SnapshotUnsupported" and "bubblewrap" in took["evalue"]
    assert restored["ename"] == "SnapshotUnsupported"
    assert busy["ename"] == "RestoreInProgress" and "under way" in busy["evalue"]
    assert face.asked == []


def test_each_refusal_names_its_cause(monkeypatch):
    from fakes.backend import FakeBackend
    from sandbox_kernel.backends.local import snapshots as local_snapshots
    from sandbox_kernel.backends.local.backend import LocalBackend
    from sandbox_kernel.policy import Policy

    fake = FakeBackend()  # any backend without its own: E2B and Modal say this with their names
    assert "cannot snapshot or restore a kernel yet" in fake.snapshot_refusal()
    assert fake.describe()["snapshots"]["supported"] is False
    assert "fork of a kernel on the" in fake.fork_refusal() and "not supported yet" in fake.fork_refusal()
    assert fake.describe()["snapshots"]["fork"] is False and fake.describe()["snapshots"]["fork_why_not"]

    bwrap = LocalBackend(Policy(), "k" * 12, runtime="bubblewrap")
    assert "the bubblewrap runtime has no checkpoint" in bwrap.snapshot_refusal()
    assert "cannot fork a kernel" in bwrap.fork_refusal()
    gvisor = LocalBackend(Policy(), "k" * 12, runtime="gvisor")
    monkeypatch.setattr(local_snapshots, "rootless_here", lambda: False)
    assert gvisor.snapshot_refusal() is None and gvisor.fork_refusal() is None
    assert gvisor.describe()["snapshots"] == {"snapshot": True, "restore": True, "supported": True, "fork": True}
    monkeypatch.setattr(local_snapshots, "rootless_here", lambda: True)
    assert "rootless runsc cannot restore" in gvisor.snapshot_refusal()
    assert "rootless runsc cannot restore" in gvisor.fork_refusal() and "be forked" in gvisor.fork_refusal()
    assert "run it through the sandbox service or as root" in gvisor.snapshot_refusal()
    assert gvisor.describe()["snapshots"]["fork"] is False
    from sandbox_kernel.backends.local.service.client import ServiceRuntime

    served = LocalBackend(Policy(), "k" * 12, runtime="gvisor")  # not root, its sandbox the service's
    served._runtime = ServiceRuntime("/run/sandbox-kernel/service.sock", {"base": "/var/lib/x"})
    assert served.snapshot_refusal() is None and served.fork_refusal() is None
    assert served.describe()["snapshots"] == {"snapshot": True, "restore": True, "supported": True, "fork": True}
    monkeypatch.setattr(local_snapshots, "rootless_here", lambda: False)
    egress = LocalBackend(Policy(network="allowlist", allow_domains=("example.org",)), "k" * 12, runtime="gvisor")
    assert "network egress" in egress.snapshot_refusal()


def test_doctor_lists_what_each_backend_does_of_snapshot_restore_and_fork(monkeypatch):
    """``sandbox-kernel doctor`` (each backend, each local runtime) says which of snapshot,
    restore and fork a backend does, and why not in the backend's own words, as
    ``kernel_info``'s ``sandbox.snapshots`` does; asking builds the backend, starts nothing."""
    from sandbox_kernel.backends import load_backend
    from sandbox_kernel.backends.local import LocalBackend
    from sandbox_kernel.backends.local import snapshots as local_snapshots
    from sandbox_kernel.doctor import copies_line, copy_operations
    from sandbox_kernel.policy import Policy

    monkeypatch.setattr(local_snapshots, "rootless_here", lambda: False)
    gvisor = LocalBackend(Policy(), kernel_id="doctor-copies", runtime="gvisor")
    assert copy_operations(gvisor) == {"snapshot": "yes", "restore": "yes", "fork": "yes"}
    assert copies_line(copy_operations(gvisor)) == "snapshot, restore, fork: yes"
    monkeypatch.setattr(local_snapshots, "rootless_here", lambda: True)
    rootless = copy_operations(gvisor)
    assert all("rootless runsc cannot restore" in why for why in rootless.values()), rootless
    bwrap = copy_operations(LocalBackend(Policy(), kernel_id="doctor-copies", runtime="bubblewrap"))
    assert "bubblewrap runtime has no checkpoint" in bwrap["snapshot"] and "cannot fork" in bwrap["fork"]
    assert copies_line(bwrap).startswith("snapshot, restore: the bubblewrap runtime has no checkpoint")
    e2b = copy_operations(load_backend("e2b")(Policy(), kernel_id="doctor-copies"))
    assert e2b == {"snapshot": "yes", "restore": "yes", "fork": "yes"}  # the SDK's own calls
    ops = copy_operations(load_backend("modal")(Policy(), kernel_id="doctor-copies"))
    assert all("Modal" in why for why in ops.values()), ops  # each refusal names its backend
    # Ray: as local gVisor on the nodes (a node's own refusal, rootless runsc, is known once
    # its sandbox runs); a runtime without checkpoint or a kernel with egress refused, naming it
    ray = load_backend("ray")
    assert copy_operations(ray(Policy(), kernel_id="doctor-copies")) == {"snapshot": "yes", "restore": "yes",
                                                                         "fork": "yes"}
    bwrap_ray = copy_operations(ray(Policy(), kernel_id="doctor-copies", runtime="bubblewrap"))
    assert all("bubblewrap runtime has no checkpoint" in why and "Ray backend" in why
               for why in bwrap_ray.values()), bwrap_ray
    egress_ray = ray(Policy(network="allowlist", allow_domains=("example.org",)), kernel_id="doctor-copies")
    assert all("network egress" in why and "Ray backend" in why for why in copy_operations(egress_ray).values())
    assert egress_ray.fork_argument("/x/fork-a-0") == "--RayBackend.fork_from=/x/fork-a-0"
    assert gvisor.fork_argument("/x/fork-a-0") == "--LocalBackend.fork_from=/x/fork-a-0"
