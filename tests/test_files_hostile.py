"""File transfer against a hostile agent and a lying kernel (fast tier: nothing runs).

The sandbox is hostile, so the host checks every download: chunks in order,
under the size cap, and the size and SHA-256 the agent then claims equal the
bytes it sent.  A download that does not add up is an error, and the client
helper (:mod:`sandbox_kernel.files_client`) never leaves a file on the host
for it.  Both clients (blocking and ``Sandbox``) speak the one protocol of
:mod:`sandbox_kernel.client.files`, checked here against a scripted kernel.  Also: the agent's new frames are validated in ``protocol.py``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import queue
import time

import pytest
from fakes.backend import FakeBackend, default_responder
from fakes.host import RecordingHost
from sandbox_kernel import files_client, protocol
from sandbox_kernel.files import FileTransferError, FileTransfers
from sandbox_kernel.lifecycle import IdleLifecycle
from sandbox_kernel.policy import Policy
from sandbox_kernel.relay import Relay
from sandbox_kernel.sandbox_state import SandboxState

log = logging.getLogger("test_files_hostile")
DATA = bytes(range(256)) * 4096  # 1 MiB


def hostile(kind: str):
    """A responder that answers ``get`` wrongly in the way ``kind`` names."""

    def respond(fake: FakeBackend, frame: dict) -> None:
        if frame.get("op") != "file":
            return default_responder(fake, frame)
        fid = frame["id"]
        if frame["action"] == "get":
            chunks = [(0, DATA[:1000]), (1000, DATA[1000:])]
            if kind == "out_of_order":
                chunks = [(0, DATA[:1000]), (5000, DATA[5000:])]
            for off, data in chunks:
                fake.emit("file_data", id=fid, offset=off, data=base64.b64encode(data).decode())
            size, sha = len(DATA), hashlib.sha256(DATA).hexdigest()
            if kind == "size":
                size += 1
            if kind == "checksum":
                sha = hashlib.sha256(b"other").hexdigest()
            if kind == "huge":
                fake.emit("file_data", id=fid, offset=len(DATA), data=base64.b64encode(DATA).decode())
            fake.emit("file", id=fid, ok=True, result={"size": size, "sha256": sha})
        elif frame["action"] == "put_open":
            fake.emit("file", id=fid, ok=True, result={"path": "/x"})
        elif frame["action"] == "put_close":
            fake.emit("file", id=fid, ok=True, result={"size": frame["size"], "sha256": "0" * 64})

    return respond


async def transfers(kind: str, max_bytes: int = 1 << 21) -> tuple[Relay, FileTransfers]:
    relay = Relay(FakeBackend(responder=hostile(kind)), RecordingHost(), max_frame_bytes=1 << 24, log=log)
    relay.files = FileTransfers(relay, max_bytes)
    await relay.start()
    return relay, relay.files


async def download_all(files: FileTransfers, path: str) -> bytes:
    out = b""
    async for _, chunk in files.download(path):
        out += chunk
    return out


@pytest.mark.parametrize("kind", ["size", "checksum", "out_of_order", "huge"])
def test_a_download_that_does_not_add_up_is_an_error(kind):
    async def main():
        relay, files = await transfers(kind, max_bytes=len(DATA) + 10)
        with pytest.raises(FileTransferError) as err:
            await download_all(files, "f.bin")
        await relay.shutdown()
        return err.value

    err = asyncio.run(main())
    assert {"size": "does not match", "checksum": "does not match", "out_of_order": "out of order",
            "huge": "transfer limit"}[kind] in str(err)


def test_an_honest_answer_passes_and_an_upload_the_agent_misreports_is_not_confirmed():
    async def main():
        relay, files = await transfers("honest")
        assert await download_all(files, "f.bin") == DATA
        fid = await files.upload_open("x", 3)
        await files.upload_data(fid, 0, b"abc")
        with pytest.raises(FileTransferError, match="not confirmed"):
            await files.upload_close(fid, 3, hashlib.sha256(b"abc").hexdigest())
        with pytest.raises(FileTransferError, match="transfer limit"):
            await files.upload_open("x", files.max_bytes + 1)
        await relay.shutdown()

    asyncio.run(main())


@pytest.mark.parametrize("op", ["upload", "download"])
def test_no_idle_step_cuts_into_a_transfer_the_sandbox_is_slow_to_answer(op):
    """CI: an idle checkpoint ran while a restored gVisor sandbox was still reading an
    upload (1 s pause, 2 s checkpoint); the upload then failed on a closed input.  The
    agent here answers only when released, the idle timer ticks long past every step
    meanwhile: the sandbox stays running, and once released the transfer completes."""
    release = asyncio.Event()
    held: list[dict] = []

    def slow(fake: FakeBackend, frame: dict) -> None:
        if frame.get("op") == "file" and frame["action"] in ("put_close", "get") and not release.is_set():
            held.append(frame)
            return
        hostile("honest")(fake, frame)

    async def main():
        policy = Policy(pause_after_s=1.0, checkpoint_after_s=2.0)
        relay = Relay(FakeBackend(policy, responder=slow), RecordingHost(), max_frame_bytes=1 << 24, log=log)
        relay.files = FileTransfers(relay, 1 << 21)
        await relay.start()
        timer = IdleLifecycle(relay, policy, log)
        if op == "upload":
            fid = await relay.files.upload_open("x", 3)
            await relay.files.upload_data(fid, 0, b"abc")
            task = asyncio.ensure_future(relay.files.upload_close(fid, 3, hashlib.sha256(b"abc").hexdigest()))
        else:
            task = asyncio.ensure_future(download_all(relay.files, "f.bin"))
        while not held:
            await asyncio.sleep(0)
        for idle in (1.5, 2.5, 60.0):  # past the pause, the checkpoint, and then some
            relay.last_activity = time.monotonic() - idle  # that long since the transfer's last step
            await timer.tick()
            assert relay.state is SandboxState.RUNNING, f"{relay.state} during a transfer"
        release.set()
        slow(relay.backend, held.pop())
        if op == "upload":
            with pytest.raises(FileTransferError, match="not confirmed"):  # the honest fake's checksum
                await task
        else:
            assert await task == DATA
        relay.last_activity = time.monotonic() - 1.5  # the transfer over: idle again as usual
        await timer.tick()
        assert relay.state is SandboxState.PAUSED
        await relay.shutdown()

    asyncio.run(main())


@pytest.mark.parametrize("frame", [
    {"seq": 1, "op": "file", "id": "f1"},                                     # no ok
    {"seq": 1, "op": "file", "id": "f1", "ok": True, "result": []},           # result not an object
    {"seq": 1, "op": "file", "id": "f1", "ok": False, "ename": "x y", "error": "e"},
    {"seq": 1, "op": "file", "id": 7, "ok": True, "result": {}},              # id not a string
    {"seq": 1, "op": "file_data", "id": "f1", "offset": -1, "data": ""},
    {"seq": 1, "op": "file_data", "id": "f1", "offset": 0, "data": "not base64!"},
])
def test_malformed_file_frames_are_protocol_errors(frame):
    with pytest.raises(protocol.ProtocolError):
        protocol.validate_agent_frame(frame)


class ScriptedClient:
    """A kernel client whose IOPub answers are scripted (for the client helper's checks)."""

    def __init__(self, answers):
        from jupyter_client.session import Session

        self.session = Session(key=b"")
        self.control_channel = type("C", (), {"socket": None})()
        self.answers = answers
        self.sent: list[dict] = []
        self.session.send = self._send  # type: ignore[method-assign]
        self.pending: list[dict] = []

    def _send(self, sock, msg, buffers=None):
        if buffers:
            msg["buffers"] = buffers
        self.sent.append(msg)
        cid = msg["content"].get("comm_id")
        data = msg["content"].get("data") or {}
        for ans in self.answers(msg["header"]["msg_type"], data):
            body, bufs = ans
            self.pending.append({"msg_type": "comm_msg", "parent_header": {"msg_id": msg["header"]["msg_id"]},
                                 "content": {"comm_id": cid, "data": {"id": data.get("id"), **body}},
                                 "buffers": bufs})

    def get_iopub_msg(self, timeout=None):
        if not self.pending:
            raise queue.Empty
        return self.pending.pop(0)


@pytest.mark.parametrize("lie", ["checksum", "error_at_end", "out_of_order"])
def test_the_client_never_leaves_a_corrupt_file(tmp_path, lie):
    def answers(msg_type, data):
        if msg_type == "comm_open":
            return [({"kind": "hello", "chunk_bytes": 1024, "max_bytes": 1 << 20}, [])]
        if data.get("op") != "download":
            return []
        chunks = [({"kind": "chunk", "offset": 0}, [b"a" * 10]),
                  ({"kind": "chunk", "offset": 99 if lie == "out_of_order" else 10}, [b"b" * 10])]
        if lie == "error_at_end":
            return [*chunks, ({"kind": "reply", "status": "error", "ename": "FileTransferError",
                               "evalue": "the sandbox lied"}, [])]
        return [*chunks, ({"kind": "reply", "status": "ok", "size": 20,
                           "sha256": hashlib.sha256(b"x").hexdigest()}, [])]

    kc = ScriptedClient(answers)
    target = tmp_path / "out.bin"
    with pytest.raises(FileTransferError):
        files_client.download(kc, "out.bin", target, timeout=5)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_the_proxy_answers_the_comm_itself_and_drops_forgeries_from_the_sandbox():
    """The file comm is answered host side (the inner kernel never sees it); a comm the
    sandbox opens on the same target, or a message on an open file comm's id, is dropped."""
    from fakes.backend import jupyter_msg
    from fakes.kernel import SHELL, ProxyHarness

    def respond(fake: FakeBackend, frame: dict) -> None:
        if frame.get("op") == "file" and frame["action"] == "stat":
            fake.emit("file", id=frame["id"], ok=True,
                      result={"path": "/home/sandbox/x", "type": "file", "size": 3, "mtime": 1.0, "mode": 420})
        else:
            default_responder(fake, frame)

    async def main():
        h = ProxyHarness(FakeBackend(responder=respond))
        await h.start()
        cid = "c1"
        for msg_type, content in (("comm_open", {"comm_id": cid, "target_name": "sandbox_kernel.files",
                                                 "data": {}}),
                                  ("comm_msg", {"comm_id": cid, "data": {"op": "stat", "id": "r1",
                                                                         "path": "x"}})):
            await h.kernel._relay_comm(SHELL, [b"frontend"], {**jupyter_msg(msg_type, content), "buffers": []})
        answers = [m.content["data"] for m in h.sent if m.msg_type == "comm_msg"]
        assert answers[0]["kind"] == "hello"
        assert answers[1] == {"kind": "reply", "id": "r1", "status": "ok", "stat": {
            "type": "file", "size": 3, "mtime": 1.0, "mode": 420, "path": "/home/sandbox/x"}}
        relayed = [f for f in h.fake.written if f.get("op") == "msg"]
        assert not [f for f in relayed if f["msg"]["header"]["msg_type"].startswith("comm_")]
        n = len(h.sent)
        h.fake.iopub({"msg_id": "x"}, "comm_msg", {"comm_id": cid, "data": {"kind": "reply", "id": "r2"}})
        h.fake.iopub({"msg_id": "x"}, "comm_open", {"comm_id": "c2", "target_name": "sandbox_kernel.files",
                                                   "data": {}})
        await asyncio.sleep(0.05)
        assert len(h.sent) == n  # both dropped
        await h.stop()

    asyncio.run(main())


def _scripted_kernel(files: dict[str, bytes]):
    """Answers like the proxy's file comm over an in-memory folder (the clients' checks)."""
    uploads: dict[str, bytearray] = {}

    def answers(msg_type, data, buffers=()):
        if msg_type == "comm_open":
            return [({"kind": "hello", "chunk_bytes": 1024, "max_bytes": 1 << 20}, [])]
        op, path = data.get("op"), data.get("path")
        if op == "upload_begin":
            uploads[data["id"]] = bytearray()
            return [({"kind": "reply", "status": "ok", "path": path}, [])]
        if op == "upload_chunk":
            uploads[data["id"]] += b"".join(buffers)
            return []
        if op == "upload_end":
            blob = bytes(uploads.pop(data["id"]))
            files["up.bin"] = blob
            return [({"kind": "reply", "status": "ok", "path": "/home/sandbox/up.bin", "size": len(blob),
                      "sha256": hashlib.sha256(blob).hexdigest()}, [])]
        if op in ("stat", "remove") and path not in files:
            return [({"kind": "reply", "status": "error", "ename": "FileNotFoundError", "evalue": path}, [])]
        if op == "stat":
            return [({"kind": "reply", "status": "ok", "stat": {"path": path, "type": "file",
                                                                "size": len(files[path])}}, [])]
        if op == "remove":
            del files[path]
            return [({"kind": "reply", "status": "ok", "path": path, "removed": "file"}, [])]
        if op == "sync":
            return [({"kind": "reply", "status": "ok", "files": [], "note": "nothing to copy"}, [])]
        return []

    return answers


def test_the_blocking_client_streams_a_file_up_and_has_stat_remove_sync(tmp_path):
    files = {"a.txt": b"abc"}
    script = _scripted_kernel(files)
    kc = ScriptedClient(lambda msg_type, data: script(msg_type, data, kc.sent[-1].get("buffers") or []))
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(5000))
    with files_client.FilesClient(kc, timeout=5) as fc:
        assert fc.upload("up.bin", src)["size"] == 5000 and files["up.bin"] == src.read_bytes()
        assert len([m for m in kc.sent if (m["content"].get("data") or {}).get("op") == "upload_chunk"]) == 5
        assert fc.stat("a.txt") == {"path": "a.txt", "type": "file", "size": 3}
        assert fc.remove("a.txt") == {"path": "a.txt", "removed": "file"}
        with pytest.raises(FileNotFoundError):
            fc.stat("a.txt")
        assert fc.sync() == {"files": [], "note": "nothing to copy"}
    assert kc.sent[-1]["header"]["msg_type"] == "comm_close"
    assert "Blocking :meth:`FileComm.sync`" in files_client.FilesClient.sync.__doc__


def test_the_agent_client_has_stat_remove_sync_over_the_same_protocol():
    from jupyter_client.session import Session
    from sandbox_kernel import Sandbox
    from sandbox_kernel.client.transport import Transport

    files = {"a.txt": b"abc"}
    script = _scripted_kernel(files)

    class ScriptedTransport(Transport):
        binary_buffers = True
        where = "a script"

        async def start(self, deliver, timeout_s):
            self.deliver, self.loop, self.session = deliver, asyncio.get_running_loop(), Session(key=b"")

        def message(self, msg_type, content):
            return self.session.msg(msg_type, content)

        def send(self, channel, msg):
            data = msg["content"].get("data") or {}
            for body, bufs in script(msg["header"]["msg_type"], data, msg.get("buffers") or []):
                answer = {"msg_type": "comm_msg", "parent_header": {"msg_id": msg["header"]["msg_id"]},
                          "content": {"comm_id": msg["content"]["comm_id"], "data": {"id": data.get("id"), **body}},
                          "buffers": bufs}
                self.loop.call_soon(self.deliver, "iopub", answer)

        async def close(self):
            pass

    with Sandbox(transport=ScriptedTransport()) as sbx:
        assert sbx.upload(b"x" * 2500, "up.bin")["size"] == 2500 and files["up.bin"] == b"x" * 2500
        assert sbx.stat("a.txt")["size"] == 3
        assert sbx.remove("a.txt")["removed"] == "file"
        with pytest.raises(FileNotFoundError):
            sbx.remove("a.txt")
        assert sbx.sync()["files"] == []
        assert sbx.aio._routes == {}  # every answer's route was dropped
