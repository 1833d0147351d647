"""The trust boundary as code: what runs in the sandbox (``guest/``) and its wire contract.

* ``guest/`` imports nothing from the host package, and the agent's relay
  needs only the standard library, ``zmq`` and ``jupyter_client``;
* every frame the agent builds passes the host's parser
  (:class:`protocol.FrameDecoder` + :func:`protocol.validate_agent_frame`)
  with its message intact, and every frame the host builds
  (:func:`protocol.host_msg_frame`, :func:`protocol.host_op_frame`) does what
  it says in the agent.

No sandbox, no inner kernel, no cell code: an :class:`Agent` object is built
in this process with its stdin and stdout on pipes, its kernel sockets on
in-process ZMQ sockets, and signals to the (absent) inner kernel recorded.
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import sandbox_kernel.guest as guest
import zmq
from jupyter_client.session import Session
from sandbox_kernel import protocol
from sandbox_kernel.guest.agent import core as agent_mod
from sandbox_kernel.guest.agent.interpreter import patches, warm

GUEST = Path(guest.__file__).parent
#: What the in-sandbox interpreter brings; only the inner kernel's bootstrap imports them.
INTERPRETER_PACKAGES = {"ipykernel", "IPython", "pygments", "stack_data"}
RELAY_PACKAGES = {"zmq", "jupyter_client"}


# ---------------------------------------------------------------------------
# Imports
# ---------------------------------------------------------------------------


def _imports(tree: ast.AST):
    """(top-level package, relative level, inside a function or class?) of every import."""
    def walk(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name.split(".")[0], 0, inner, child.lineno
            elif isinstance(child, ast.ImportFrom):
                yield (child.module or "").split(".")[0], child.level, inner, child.lineno
            yield from walk(child, inner)
    yield from walk(tree, False)


SIDE = GUEST / "agent"
#: The agent process's modules; the rest of ``agent/`` (``interpreter/``) runs in the
#: user's interpreter, and ``main.py`` dispatches to one or the other.
AGENT_PROCESS = {"core.py", "executing.py", "wire.py", "hardening.py", "files.py", "egress.py"}


def _modules() -> list[Path]:
    return sorted(SIDE.rglob("*.py"))


def test_the_sandbox_side_is_one_package_shipped_as_one_archive(tmp_path):
    assert sorted(p.name for p in GUEST.iterdir() if p.suffix in (".py", ".c")) == ["__init__.py", "statx_shim.c"]
    assert b"statx" in guest.statx_shim_source()
    archive = Path(guest.agent_archive(tmp_path))
    assert archive.name == f"agent-{guest.agent_version()}.pyz" and archive.stat().st_mode & 0o777 == 0o644
    names = set(zipfile.ZipFile(archive).namelist())
    sources = {f"{guest.AGENT_PACKAGE}/{p.relative_to(SIDE).as_posix()}" for p in _modules()}
    assert names == {"__main__.py"} | sources | {n[:-3] + ".pyc" for n in sources}
    assert guest.agent_archive(tmp_path) == str(archive)  # built once: the same file, kept
    assert archive.stat().st_mtime_ns == Path(guest.agent_archive(tmp_path)).stat().st_mtime_ns
    # it runs from itself alone: no host package on the path (-I), the agent's own --help
    out = subprocess.run([sys.executable, "-I", str(archive), "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env={"PATH": os.environ.get("PATH", "")}, timeout=60)
    assert out.returncode == 0 and "--kernel-user" in out.stdout, out.stderr


def test_another_version_is_another_archive(tmp_path, monkeypatch):
    first = guest.agent_version()
    real = guest._agent_sources
    monkeypatch.setattr(guest, "_agent_sources", lambda: [*real(), ("extra.py", b"X = 1\n")])
    guest.agent_version.cache_clear()
    try:
        assert guest.agent_version() != first
        assert Path(guest.agent_archive(tmp_path)).name == f"agent-{guest.agent_version()}.pyz"
    finally:
        guest.agent_version.cache_clear()


@pytest.mark.parametrize("path", [GUEST / "__init__.py", *_modules()], ids=lambda p: str(p.relative_to(GUEST)))
def test_guest_imports_nothing_from_the_host_package(path):
    tree = ast.parse(path.read_text())
    if path.parent == GUEST:  # the host's lookup: no relative import at all
        bad = [(pkg, line) for pkg, level, _, line in _imports(tree) if level > 0 or pkg == "sandbox_kernel"]
    else:  # relative imports only inside agent/, never above it
        depth = len(path.relative_to(SIDE).parts)
        bad = [(pkg, line) for pkg, level, _, line in _imports(tree) if level >= depth + 1 or pkg == "sandbox_kernel"]
    assert not bad, f"guest/{path.relative_to(GUEST)} imports host code at {bad}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(GUEST)))
def test_each_process_imports_only_its_own(path):
    tree = ast.parse(path.read_text())
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    found = [i for i in _imports(tree) if i[1] == 0]  # absolute imports (relative ones: below)
    module_level = {pkg for pkg, _, nested, _ in found if not nested}
    assert module_level <= allowed, f"{path.name} imports at module level: {module_level - allowed}"
    everything = {pkg for pkg, _, _, _ in found}
    relative = {(level, mod) for mod, level in _relative(tree)}
    if path.name in AGENT_PROCESS:  # the agent never loads the interpreter's packages or patches
        assert everything <= allowed | RELAY_PACKAGES, everything - allowed - RELAY_PACKAGES
        assert all(not mod.startswith("interpreter") or mod == "interpreter.clone" for _, mod in relative)
    elif "interpreter" in path.parts:  # the interpreter never loads the agent's loop
        assert everything <= allowed | RELAY_PACKAGES | INTERPRETER_PACKAGES, everything - allowed
        assert all(level == 1 for level, _ in relative), relative


def test_every_patch_finds_what_it_replaces_in_the_installed_releases():
    """The sandbox's interpreter is this environment's: each patch's targets exist here."""
    assert len(patches.PATCHES) == 6
    for patch in patches.PATCHES:
        package, version, attrs = patch.target
        assert attrs and version, patch.__name__
        assert patches.missing_targets(attrs) == [], f"{patch.__name__} (for {package} {version})"


def test_a_patch_whose_target_is_gone_is_left_out_and_said(monkeypatch, capsys):
    applied = []
    monkeypatch.setattr(patches, "PATCHES", [])
    patches.targets("ipykernel", "7.4", "ipykernel.kernelbase:Kernel.no_such_method")(lambda: applied.append("gone"))
    patches.targets("ipykernel", "7.4", "ipykernel.kernelbase:Kernel.dispatch_shell")(lambda: applied.append("fits"))
    assert patches.apply_all() == ["<lambda>"]
    assert applied == ["fits"]
    err = capsys.readouterr().err
    assert "written for ipykernel 7.4" in err and "has no ipykernel.kernelbase:Kernel.no_such_method" in err


def _relative(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            yield node.module or "", node.level


# ---------------------------------------------------------------------------
# The wire contract
# ---------------------------------------------------------------------------


class Wire:
    """An :class:`Agent` with pipes for stdio and in-process ZMQ sockets for its kernel."""

    def __init__(self, monkeypatch, tmp_path):
        self.host_in, agent_out = os.pipe()  # agent -> host
        agent_in, self.host_out = os.pipe()  # host -> agent
        os.set_blocking(self.host_in, False)
        self.signals: list[tuple[int, int]] = []
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(fileno=lambda: agent_in))
        monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(fileno=lambda: agent_out))
        # never harden (prctl) the test process, never signal a real process group
        monkeypatch.setattr(agent_mod, "harden_self", lambda: {"agent_uid": 0, "pid1": False,
                                                               "non_dumpable": True})
        monkeypatch.setattr(agent_mod.os, "killpg", lambda pgid, sig: self.signals.append((pgid, sig)))
        monkeypatch.setenv("SANDBOX_KERNEL_RUNTIME_DIR", "")
        monkeypatch.setattr(agent_mod.tempfile, "tempdir", str(tmp_path))
        self.agent = agent_mod.Agent(cwd=str(tmp_path))
        self._fds = [self.host_in, agent_out, agent_in, self.host_out]
        self.decoder = protocol.FrameDecoder(on_drop=self._dropped)
        self.drops: list[str] = []
        # the inner kernel's side of shell/control/stdin, and "its" session (same key)
        self.kernel_session = Session(key=self.agent.session.key, username="kernel")
        self.routers = {}
        for name in ("shell", "control", "stdin"):
            router = self.agent.ctx.socket(zmq.ROUTER)
            router.bind(f"inproc://{name}")
            dealer = self.agent.ctx.socket(zmq.DEALER)
            dealer.connect(f"inproc://{name}")
            self.routers[name] = router
            self.agent.sockets[name] = dealer
        self.agent.kernel = types.SimpleNamespace(pid=4242, stderr=None)  # no process behind it

    def _dropped(self, why: str) -> None:
        self.drops.append(why)

    def frames(self) -> list[protocol.AgentFrame]:
        """Everything the agent wrote since the last call, through the host's parser."""
        data = b""
        while True:
            try:
                chunk = os.read(self.host_in, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        frames = [protocol.validate_agent_frame(f) for f in self.decoder.feed(data)]
        assert not self.drops, self.drops
        return frames

    def host_sends(self, *frames: bytes) -> None:
        """Write host frames to the agent's stdin and let it read them, as its loop does."""
        os.write(self.host_out, b"".join(frames))
        assert self.agent._read_host()

    def kernel_sends(self, channel: str, msg: dict, buffers: list[bytes] | None = None, *,
                     forged: bool = False) -> None:
        """Hand the agent one message of the inner kernel, as its socket would
        (``forged``: with a signature made without the key, as a cell could)."""
        parts = self.kernel_session.serialize(msg, ident=[b"kernel"])
        if forged:
            parts[parts.index(b"<IDS|MSG>") + 1] = b"0" * 64
        sock = types.SimpleNamespace(recv_multipart=lambda: parts + list(buffers or []))
        self.agent.relay_inner(channel, sock)

    def kernel_receives(self, channel: str) -> dict:
        """The message the agent sent to the inner kernel on ``channel``, checked and parsed."""
        router = self.routers[channel]
        assert router.poll(5000), f"nothing arrived on {channel}"
        idents, parts = self.kernel_session.feed_identities(router.recv_multipart())
        return self.kernel_session.deserialize(parts, content=True)

    def close(self) -> None:
        for s in [*self.routers.values(), *self.agent.sockets.values()]:
            s.close(linger=0)
        self.agent.ctx.term()
        self.agent.in_file.close()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.agent.runtime_dir, ignore_errors=True)


@pytest.fixture
def wire(monkeypatch, tmp_path):
    w = Wire(monkeypatch, tmp_path)
    yield w
    w.close()


def _kernel_msg(session: Session, msg_type: str, content: dict, parent: dict | None = None) -> dict:
    return session.msg(msg_type, content, parent=parent or {})


def test_inner_kernel_messages_arrive_whole(wire):
    """Iopub, shell and stdin messages, ASCII or not, with binary buffers: the host
    parses each and gets the inner kernel's message back unchanged."""
    s = wire.kernel_session
    request = _kernel_msg(s, "execute_request", {"code": "print('x')"})
    cases = [
        ("iopub", _kernel_msg(s, "stream", {"name": "stdout", "text": "plain ascii\n"}, request), []),
        ("iopub", _kernel_msg(s, "stream", {"name": "stdout", "text": "café ☕ \u2028 \x00\n"}, request), []),
        ("iopub", _kernel_msg(s, "comm_msg", {"comm_id": "c", "data": {"method": "update"}}, request),
         [b"\x00\xff binary", bytes(range(256))]),
        ("stdin", _kernel_msg(s, "input_request", {"prompt": "name? ", "password": False}, request), []),
        ("shell", _kernel_msg(s, "execute_reply", {"status": "ok", "execution_count": 1,
                                                   "user_expressions": {}}, request), []),
    ]
    for channel, msg, buffers in cases:
        wire.kernel_sends(channel, msg, buffers)
    frames = wire.frames()
    assert [f.op for f in frames] == ["msg"] * len(cases)
    assert [f.seq for f in frames] == list(range(1, len(cases) + 1))
    for frame, (channel, msg, buffers) in zip(frames, cases):
        assert frame.channel == channel
        assert frame.msg_type == msg["header"]["msg_type"]
        assert frame.msg["header"]["msg_id"] == msg["header"]["msg_id"]
        assert frame.parent_msg_id == request["header"]["msg_id"]
        assert frame.msg["content"] == msg["content"]
        assert frame.buffers == buffers


def test_frames_the_agent_makes_itself(wire):
    """ready, log, died, pong and replayed, each through the host's parser."""
    a = wire.agent
    a.emit("ready", kernel_info={"status": "ok", "protocol_version": "5.4",
                                 "language_info": {"name": "python"}}, pid=4242, guard=a.guard)
    forged = _kernel_msg(wire.kernel_session, "stream", {"name": "stdout", "text": "x"})
    wire.kernel_sends("iopub", forged, forged=True)  # dropped, and logged
    a.stderr_tail = b"Traceback (most recent call last):\n  caf\xc3\xa9 \xff\n"
    a.kernel = types.SimpleNamespace(pid=4242, stderr=None, wait=lambda: -9)
    a._kernel_died()
    frames = wire.frames()
    assert [f.op for f in frames] == ["ready", "log", "died"]
    ready, log, died = (f.body for f in frames)
    assert ready["kernel_info"]["language_info"] == {"name": "python"} and ready["guard"] == a.guard
    assert log["level"] == "warning" and "bad message from inner kernel" in log["text"]
    assert died["returncode"] == -9 and died["cause"] == "killed by signal SIGKILL"
    assert "café \ufffd" in died["stderr"]
    assert wire.signals == [(4242, 9)]  # its process group is killed (here: recorded)

    wire.host_sends(protocol.host_op_frame("ping"), protocol.host_op_frame("replay", after=1))
    frames = wire.frames()
    assert [(f.op, f.seq) for f in frames] == [("pong", 4), ("log", 2), ("died", 3), ("pong", 4),
                                                ("replayed", 5)]
    assert frames[-1].body["after"] == 1


def test_host_messages_reach_the_inner_kernel(wire):
    """host_msg_frame on shell, control and stdin, with buffers, becomes a signed
    message the inner kernel's Session accepts, unchanged."""
    front = Session(key=b"the-frontend-key", username="user")
    sent = []
    for channel, msg_type, content in [
        ("shell", "execute_request", {"code": "x = 'é'", "silent": False}),
        ("control", "interrupt_request", {}),
        ("stdin", "input_reply", {"status": "ok", "value": "naïve ☕"}),
    ]:
        msg = front.msg(msg_type, content)
        msg["header"]["date"] = msg["header"]["date"].isoformat()  # as the relay sends it
        buffers = [b"\x00\x01 raw"] if channel == "shell" else None
        wire.host_sends(protocol.host_msg_frame(channel, msg, buffers))
        sent.append((channel, msg, buffers))
    for channel, msg, buffers in sent:
        got = wire.kernel_receives(channel)
        assert got["header"]["msg_id"] == msg["header"]["msg_id"]
        assert got["msg_type"] == msg["header"]["msg_type"]
        assert isinstance(got["header"]["date"], datetime.datetime)
        assert got["content"] == msg["content"]
        assert [bytes(b) for b in got["buffers"]] == (buffers or [])
    assert wire.frames() == []  # nothing goes back by itself


def test_host_ops_do_what_they_say(wire, monkeypatch):
    a = wire.agent
    for i in range(3):
        a.emit("log", level="info", text=f"frame {i + 1}")
    wire.frames()
    wire.host_sends(protocol.host_op_frame("ack", seq=2))
    assert [seq for seq, _ in a.sent] == [3]  # acknowledged frames are no longer kept for replay

    wire.host_sends(protocol.host_op_frame("interrupt"))
    assert wire.signals == [(4242, 2)]  # SIGINT to the inner kernel's process group

    calls = []
    monkeypatch.setattr(a, "_kill_kernel", lambda: calls.append("kill"))
    monkeypatch.setattr(a, "start_kernel", lambda: calls.append("start"))
    wire.host_sends(protocol.host_op_frame("restart"))
    assert calls == ["kill", "start"]

    assert a.running
    wire.host_sends(protocol.host_op_frame("shutdown"))
    assert not a.running
    assert wire.frames() == []


def test_agent_frames_are_ascii_lines(wire):
    """Frames survive a transport that decodes bytes as UTF-8 with replacement (E2B)."""
    s = wire.kernel_session
    wire.kernel_sends("iopub", _kernel_msg(s, "stream", {"name": "stdout", "text": "ünïcödé ☕\n"}))
    wire.agent.emit("log", level="info", text="ünïcödé ☕")
    raw = b""
    while True:
        try:
            raw += os.read(wire.host_in, 1 << 20)
        except BlockingIOError:
            break
    lines = raw.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert all(line.isascii() for line in lines)
    frames = [protocol.validate_agent_frame(f)
              for f in protocol.FrameDecoder().feed(raw.decode("utf-8", "replace").encode())]
    assert frames[0].msg["content"]["text"] == "ünïcödé ☕\n" and frames[1].body["text"] == "ünïcödé ☕"


# ---------------------------------------------------------------------------
# The completer's warm start (C16)
# ---------------------------------------------------------------------------


def test_agent_and_host_agree_where_the_jedi_seed_is():
    assert warm.JEDI_SEED_DIR == guest.JEDI_SEED_PATH


def test_seed_links_fresh_entries_of_the_read_only_cache(tmp_path, monkeypatch):
    seed = tmp_path / "seed"
    (seed / "V").mkdir(parents=True)
    old_src, new_src = tmp_path / "old.py", tmp_path / "new.py"
    old_src.write_text("x = 1\n")
    new_src.write_text("y = 2\n")
    os.utime(old_src, (1000, 1000))
    for name in ("fresh.pkl", "stale.pkl"):
        (seed / "V" / name).write_bytes(b"pickle")
    os.utime(seed / "V" / "stale.pkl", (2000, 2000))  # older than new.py
    (seed / "manifest.json").write_text(json.dumps({"files": {
        "V/fresh.pkl": str(old_src), "V/stale.pkl": str(new_src), "V/gone.pkl": str(old_src),
        "../escape.pkl": str(old_src), "/abs.pkl": str(old_src)}}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert warm.seed_jedi_cache(str(seed)) == 1
    cache = tmp_path / "cache" / "jedi"
    assert os.readlink(cache / "V" / "fresh.pkl") == str(seed / "V" / "fresh.pkl")
    assert sorted(os.listdir(cache / "V")) == ["fresh.pkl"]  # stale: parso would write through the link
    assert sorted(os.listdir(cache)) == ["PARSO-CACHE-LOCK", "V"]  # nothing outside it
    assert not (tmp_path / "escape.pkl").exists()
    # the next interpreter of the same sandbox finds the links in place
    assert warm.seed_jedi_cache(str(seed)) == 0
    assert os.readlink(cache / "V" / "fresh.pkl") == str(seed / "V" / "fresh.pkl")
    # no seed (cloud sandboxes) or a broken manifest: nothing happens
    assert warm.seed_jedi_cache(str(tmp_path / "absent")) == 0
    (seed / "manifest.json").write_text("[1, 2]")
    assert warm.seed_jedi_cache(str(seed)) == 0


def test_agent_warms_the_completer_with_its_own_request(wire, monkeypatch):
    """The warm-up goes through the inner kernel's shell socket with the agent's own msg id;
    its reply and status are never relayed."""
    import threading

    pub = wire.agent.ctx.socket(zmq.PUB)
    pub.bind("inproc://iopub")
    sub = wire.agent.ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("inproc://iopub")
    wire.agent.sockets["iopub"] = sub
    wire.routers["iopub"] = pub  # closed with the others
    wire.agent.kernel = types.SimpleNamespace(pid=4242, stderr=None, poll=lambda: None)
    took: list[float] = []
    t = threading.Thread(target=lambda: took.append(wire.agent._warm_completer()))
    t.start()
    router = wire.routers["shell"]
    assert router.poll(5000)
    idents, parts = wire.kernel_session.feed_identities(router.recv_multipart())
    req = wire.kernel_session.deserialize(parts, content=True)
    code = agent_mod.WARM_COMPLETION
    assert req["msg_type"] == "complete_request" and req["content"] == {"code": code, "cursor_pos": len(code)}
    assert req["header"]["msg_id"] in wire.agent.own_msg_ids
    wire.kernel_session.send(router, "complete_reply", {"status": "ok", "matches": ["join"], "cursor_start": 4,
                                                        "cursor_end": 6, "metadata": {}}, parent=req, ident=idents)
    t.join(10)
    assert not t.is_alive() and 0 <= took[0] < agent_mod.WARM_TIMEOUT_S
    wire.kernel_sends("iopub", _kernel_msg(wire.kernel_session, "status", {"execution_state": "idle"},
                                           parent=req))
    assert wire.frames() == []


def test_doctor_names_the_shipped_archive():
    from sandbox_kernel import doctor

    report = doctor.agent_report()
    assert report == {"version": guest.agent_version(), "archive": guest.agent_archive()}
    assert Path(report["archive"]).is_file()


def test_a_copy_interrupts_only_its_cells_of_before_until_they_end(monkeypatch):
    """The agent's bookkeeping of cells (``executing.py``): a cell ends at its reply or at its
    ``idle`` (a handler that failed sends none); after a copy only the cells of before are
    interrupted again, at most ``INTERRUPTS_MAX`` times, then it says so once."""
    from sandbox_kernel.guest.agent import executing
    monkeypatch.setattr(executing, "INTERRUPT_EVERY_S", 0.0)
    sent, said = [], []
    ex = executing.Executing(lambda: sent.append(1), said.append)

    def request(msg_id, msg_type="execute_request"):
        ex.sent({"header": {"msg_id": msg_id, "msg_type": msg_type}})

    for i in ("a", "b", "c"):
        request(i)
    request("k", "kernel_info_request")
    ex.seen("iopub", "a", b'{"msg_type": "stream"}', b'{"name": "stdout", "text": "idle"}')  # output: runs on
    ex.seen("shell", "a", b'{"msg_type": "execute_reply"}', b'{"status": "ok"}')
    ex.seen("iopub", "b", b'{"msg_type": "status"}', b'{"execution_state": "idle"}')  # no reply, but idle
    assert ex.ids == {"c"}
    ex.tick()
    assert sent == []  # no copy yet: nothing is interrupted here
    ex.copied()
    request("after")  # a cell of the copy's own
    ex.tick()
    assert len(sent) == 1
    for _ in range(2 * executing.INTERRUPTS_MAX):
        ex.tick()
    assert len(sent) == executing.INTERRUPTS_MAX and len(said) == 1 and "left to run" in said[0]
    ex.ended("c")
    ex.copied()
    ex.tick()
    assert len(sent) == executing.INTERRUPTS_MAX + 1  # "after" is of before this second copy
    ex.clear()
    ex.tick()
    assert len(sent) == executing.INTERRUPTS_MAX + 1 and ex.ids == set()
