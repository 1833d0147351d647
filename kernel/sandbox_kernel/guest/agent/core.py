"""The agent: PID 1 of the sandbox, the owner of the channel to the host.

It starts the inner kernel (a stock ipykernel, bootstrapped by :mod:`.interpreter`)
and relays it over stdio: host frames are handled by an op table
(:attr:`Agent.OPS`), the inner kernel's messages are spliced into ``msg`` frames.
"""

from __future__ import annotations

import base64
import collections
import hmac
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from .egress import EgressForwarder, pip_prefix_env
from .executing import Executing, msg_type
from .files import FileOps
from .hardening import harden_self, resolve_user
from .interpreter.clone import RESEED_SIGNAL
from .wire import DELIM, REPLAY_BUFFER_BYTES, WRITE_BATCH_BYTES, ascii_json, json_default

#: Bytes of the inner kernel's stderr kept to explain its death.
STDERR_TAIL_BYTES = 4096
#: Longest the agent waits for the inner kernel's first ``kernel_info_reply``, seconds.
READY_TIMEOUT_S = 120.0
#: While the loop is busy, the inner kernel's exit status and stderr are checked at
#: most this often (and whenever its stderr is readable or the poll times out).
REAP_INTERVAL_S = 0.2
#: The completion the agent asks for before it reports ``ready`` (:meth:`Agent._warm_completer`):
#: besides the builtins' stubs it loads those of ``collections`` and ``collections.abc``,
#: which most typeshed stubs import (``docs/decisions.md``, C16).
WARM_COMPLETION = "from collections import abc; abc.Ma"
#: Longest the agent waits for that completion, seconds.
WARM_TIMEOUT_S = 10.0


def describe_exit(returncode: int) -> str:
    """``"exit code N"`` or ``"killed by signal SIGNAME"`` for a ``Popen.returncode``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}"
    return f"exit code {returncode}"


class Agent:
    """Relay between the host (stdio frames) and one inner ipykernel (ZMQ, IPC)."""

    def __init__(self, cwd: str | None = None, kernel_user: str | None = None,
                 egress: tuple[int, str] | None = None, pip_prefix: str | None = None,
                 host_silence_s: float = 0.0, entry: str | None = None, spawn_first: bool = False):
        #: Seconds without a frame from the host after which the agent ends (0: never):
        #: the dead-man's switch where stdin never reaches EOF when the proxy dies (Modal,
        #: whose exec stream outlives the client); the host sends ``keepalive`` meanwhile.
        self.host_silence_s = host_silence_s
        #: What ``python <entry> --kernel`` runs: the zipapp this agent came from (``sys.argv[0]``).
        self.entry = entry or os.path.abspath(sys.argv[0])
        self.last_host_at = time.monotonic()

        self.cwd = cwd or os.getcwd()
        self.kernel_ids = resolve_user(kernel_user) if kernel_user and os.geteuid() == 0 else None
        if not os.path.isdir(self.cwd):  # a copied workspace (E2B, Modal): made here, the interpreter's
            os.makedirs(self.cwd, exist_ok=True)
            if self.kernel_ids is not None:
                os.chown(self.cwd, self.kernel_ids[0], self.kernel_ids[1])
        #: (uid, gid, home) the interpreter runs as (:attr:`kernel_ids`, above); None: as the agent.
        self.guard = harden_self()
        self.guard["uid_separated"] = self.kernel_ids is not None
        self.runtime_dir = tempfile.mkdtemp(prefix="sk-agent-")
        os.environ["SANDBOX_KERNEL_RUNTIME_DIR"] = self.runtime_dir
        #: Environment the interpreter gets beyond the agent's own (egress: pip's prefix).
        self.kernel_env: dict[str, str] = {}
        if egress is not None:
            self.kernel_env["SANDBOX_KERNEL_EGRESS"] = "allowlist"
            if pip_prefix:
                self.kernel_env.update(pip_prefix_env(pip_prefix, self.kernel_ids[:2] if self.kernel_ids else None))
        self.kernel: subprocess.Popen | None = None
        #: The running interpreter's connection file, as written (:meth:`_spawn_kernel`).
        self.kernel_conn: dict[str, Any] = {}
        self.stderr_tail = b""
        if spawn_first:
            # The interpreter starts before the agent's own imports (zmq, jupyter_client: about
            # 0.15 s), which then run beside its start: no user code runs in it before ``ready``.
            self._spawn_kernel()

        import zmq
        from jupyter_client.session import Session

        self.zmq = zmq
        self.ctx = zmq.Context()
        self.seq = 0
        self.sent: collections.deque[tuple[int, bytes]] = collections.deque()
        self.sent_bytes = 0
        self.out_fd = sys.stdout.fileno()
        self.in_fd = sys.stdin.fileno()
        self.inbuf = bytearray()
        # One read(2) per wake-up: os.read(fd, 1 MiB) also maps and unmaps its buffer.
        self.in_file = open(self.in_fd, "rb", buffering=0, closefd=False)
        self.in_chunk = bytearray(1 << 20)
        self.next_reap = 0.0
        self.session = Session(key=uuid.uuid4().hex.encode(), username="sandbox")
        self.sockets: dict[str, Any] = {}
        self.own_msg_ids: set[str] = set()
        self.executing = Executing(lambda: self._op_interrupt({}),  # a copy's cells of before
                                   lambda text: self.emit("log", level="warning", text=text))
        self.running = True
        #: Frames emitted but not written yet (see :meth:`flush`); None = write at once.
        self.outq: list[bytes] | None = None
        self.outq_bytes = 0
        self.poller: Any = None
        self.poller_kernel: Any = None
        home = (self.kernel_ids[2] if self.kernel_ids is not None else None) or os.path.expanduser("~")
        roots = tuple(dict.fromkeys(r for r in (self.cwd, home, "/tmp") if r and r != "/"))
        self.files = FileOps(self.emit, self.cwd, roots, hidden=(self.runtime_dir,),
                             owner=self.kernel_ids[:2] if self.kernel_ids is not None else None)
        if egress is not None:
            EgressForwarder(*egress).start()

    # ---- output to the host -------------------------------------------------

    def emit(self, op: str, **fields) -> None:
        self.seq += 1
        line = (
            json.dumps({"seq": self.seq, "op": op, **fields}, ensure_ascii=True,
                       separators=(",", ":"), default=json_default).encode("ascii")
            + b"\n"
        )
        self._queue(line)

    def _queue(self, line: bytes) -> None:
        """Keep ``line`` (frame number ``self.seq``) for replay and send it: now, or at
        the next :meth:`flush` while the main loop batches."""
        self.sent.append((self.seq, line))
        self.sent_bytes += len(line)
        while self.sent_bytes > REPLAY_BUFFER_BYTES and len(self.sent) > 1:
            _, old = self.sent.popleft()
            self.sent_bytes -= len(old)
        if self.outq is None:
            self._write(line)
            return
        self.outq.append(line)
        self.outq_bytes += len(line)
        if self.outq_bytes >= WRITE_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the queued frames in one go (one pipe write, one wake-up of the host)."""
        if self.outq:
            data = b"".join(self.outq)
            self.outq.clear()
            self.outq_bytes = 0
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except (BrokenPipeError, OSError):
                return  # host detached; frames stay in self.sent for replay
            view = view[n:]

    def ack(self, upto: int) -> None:
        while self.sent and self.sent[0][0] <= upto:
            _, old = self.sent.popleft()
            self.sent_bytes -= len(old)

    def replay(self, after: int) -> None:
        for seq, line in list(self.sent):
            if seq > after:
                self._write(line)

    # ---- the inner kernel ----------------------------------------------------

    def start_kernel(self) -> None:
        """(Re)start the interpreter and connect to it (op ``restart``)."""
        self._spawn_kernel()
        self._connect_kernel()

    def _spawn_kernel(self) -> None:
        """Start the interpreter (the inner ipykernel, :func:`.interpreter.run.run_inner_kernel`)
        on a new connection file: IPC sockets under :attr:`runtime_dir`, a new HMAC key.

        The file is jupyter_client's connection file format, written here with ``json``
        rather than ``jupyter_client.connect.write_connection_file``: importing
        jupyter_client costs the agent about 0.15 s, which runs beside the interpreter's
        own start instead of before it (``spawn_first``).  The socket names carry a new
        prefix each time, so a restart never meets the old interpreter's.
        """
        tag = uuid.uuid4().hex[:8]
        conn_file = os.path.join(self.runtime_dir, f"kernel-{tag}.json")
        info: dict[str, Any] = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5,
                                "ip": os.path.join(self.runtime_dir, f"k{tag}"), "key": uuid.uuid4().hex,
                                "transport": "ipc", "signature_scheme": "hmac-sha256", "kernel_name": ""}
        with os.fdopen(os.open(conn_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(info, f)
        self.kernel_conn = info
        env = {**os.environ, **self.kernel_env}
        env.pop("SANDBOX_KERNEL_AGENT", None)
        ids: dict = {}
        if self.kernel_ids is not None:
            uid, gid, home = self.kernel_ids
            for path in (self.runtime_dir, conn_file):  # the interpreter binds its sockets here
                os.chown(path, uid, gid)
            ids = {"user": uid, "group": gid, "extra_groups": []}
            if home:
                env["HOME"] = home
        self.kernel = subprocess.Popen(
            [sys.executable, self.entry, "--kernel", "-f", conn_file],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.cwd,
            env=env,
            start_new_session=True,
            **ids,
        )
        assert self.kernel.stderr is not None
        os.set_blocking(self.kernel.stderr.fileno(), False)
        self.stderr_tail = b""

    def _connect_kernel(self) -> None:
        """Connect to the interpreter :meth:`_spawn_kernel` started and wait for it to answer."""
        zmq, info = self.zmq, self.kernel_conn
        self.session.key = info["key"].encode()
        for s in self.sockets.values():
            s.close(linger=0)
        base = f"ipc://{info['ip']}-"
        self.sockets = {}
        # One identity for every channel, as jupyter_client does: ipykernel sends
        # input_request to the identity the execute_request came from.
        ident = uuid.uuid4().hex.encode()
        for name, kind in (("shell", zmq.DEALER), ("control", zmq.DEALER), ("stdin", zmq.DEALER),
                           ("iopub", zmq.SUB)):
            s = self.ctx.socket(kind)
            s.linger = 0
            if kind == zmq.SUB:
                s.setsockopt(zmq.SUBSCRIBE, b"")
            else:
                s.setsockopt(zmq.IDENTITY, ident)
            s.connect(base + str(info[f"{name}_port"]))
            self.sockets[name] = s
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Send kernel_info_request until both the reply and an IOPub message arrive."""
        zmq = self.zmq
        deadline = time.monotonic() + READY_TIMEOUT_S
        reply = None
        iopub_seen = False
        poller = zmq.Poller()
        poller.register(self.sockets["shell"], zmq.POLLIN)
        poller.register(self.sockets["iopub"], zmq.POLLIN)
        last_sent = 0.0
        kernel = self.kernel
        assert kernel is not None
        while time.monotonic() < deadline:
            if kernel.poll() is not None:
                self._kernel_died()
                return
            self._drain_stderr()
            if time.monotonic() - last_sent > 1.0 and not (reply and iopub_seen):
                msg = self.session.msg("kernel_info_request", {})
                self.own_msg_ids.add(msg["header"]["msg_id"])
                self.session.send(self.sockets["shell"], msg)
                last_sent = time.monotonic()
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                m = self._deserialize(frames)
                if m is None:
                    continue
                if sock is self.sockets["iopub"]:
                    iopub_seen = True
                elif m["header"]["msg_type"] == "kernel_info_reply":
                    reply = m
            if reply is not None and iopub_seen:
                warm_s = self._warm_completer()
                if self.kernel is None:
                    return  # it died meanwhile (reported)
                self.emit("ready", kernel_info=reply["content"], pid=self.kernel.pid, guard=self.guard,
                          warm_s=round(warm_s, 4))
                return
        self.emit("log", level="error", text=f"inner kernel not ready after {READY_TIMEOUT_S:.0f} s")
        self._kill_kernel()
        self._kernel_died()

    def _warm_completer(self, relay_iopub: bool = False) -> float:
        """Ask the inner kernel for :data:`WARM_COMPLETION` and wait for the reply.

        The first completion of a process imports jedi and loads its grammar
        and the builtins' stubs: 1.0-1.3 s under gVisor with the host's jedi
        cache (1.9-2.2 s without), 0.3 s under bubblewrap (C16, measured with
        the traceback warm-up running alongside).  Done before ``ready``, the
        user's first completion does not pay it, nor wait behind it.  The
        request goes through the inner kernel's own shell socket with the
        agent's msg id (its replies are never relayed), so jedi only ever runs
        on the kernel's own thread.  With ``relay_iopub`` (a copy's warm-up, after a
        reseed) the IOPub messages meanwhile are relayed as :meth:`relay_inner` does
        (a thread of before the copy prints on), else read and dropped (a cold start's:
        nothing of the user's runs yet).

        Returns
        -------
        float
            Seconds it took (:data:`WARM_TIMEOUT_S` at most; a later reply is dropped).
        """
        zmq = self.zmq
        code = WARM_COMPLETION
        msg = self.session.msg("complete_request", {"code": code, "cursor_pos": len(code)})
        msg_id = msg["header"]["msg_id"]
        self.own_msg_ids.add(msg_id)
        t0 = time.monotonic()
        self.session.send(self.sockets["shell"], msg)
        poller = zmq.Poller()
        poller.register(self.sockets["shell"], zmq.POLLIN)
        poller.register(self.sockets["iopub"], zmq.POLLIN)
        while time.monotonic() - t0 < WARM_TIMEOUT_S:
            if self.kernel is None:
                break
            if self.kernel.poll() is not None:
                self._kernel_died()
                break
            self._drain_stderr()
            self.executing.tick()
            for sock, _ in poller.poll(100):
                if relay_iopub and sock is self.sockets["iopub"]:
                    self.relay_inner("iopub", sock)
                    continue
                m = self._deserialize(sock.recv_multipart())  # the agent's own: not relayed
                if m is not None and sock is self.sockets["shell"]:
                    if m["parent_header"].get("msg_id") == msg_id:
                        return time.monotonic() - t0
                    self.executing.ended(m["parent_header"].get("msg_id"))  # a cell of before
        return time.monotonic() - t0

    def _deserialize(self, frames):
        try:
            _, msg_list = self.session.feed_identities(frames)
            return self.session.deserialize(msg_list, content=True)
        except Exception as err:  # noqa: BLE001 - a cell can write garbage to our sockets
            self.emit("log", level="warning", text=f"bad message from inner kernel: {err}")
            return None

    def _drain_stderr(self) -> None:
        if self.kernel is None or self.kernel.stderr is None:
            return
        try:
            data = self.kernel.stderr.read()
        except (BlockingIOError, ValueError, OSError):
            return
        if data:
            self.stderr_tail = (self.stderr_tail + data)[-STDERR_TAIL_BYTES:]

    def _kernel_died(self) -> None:
        self._drain_stderr()
        kernel = self.kernel
        assert kernel is not None
        rc = kernel.wait()
        try:
            os.killpg(kernel.pid, signal.SIGKILL)  # reap its children too
        except OSError:
            pass
        self.emit("died", returncode=rc, cause=describe_exit(rc),
                  stderr=self.stderr_tail.decode("utf-8", "replace"))
        self.kernel = None
        self.executing.clear()

    def _kill_kernel(self) -> None:
        if self.kernel is None:
            return
        try:
            os.killpg(self.kernel.pid, signal.SIGKILL)
        except OSError:
            pass
        self.kernel.wait()
        self.kernel = None
        self.executing.clear()

    # ---- input from the host ---------------------------------------------------

    def handle_host_frame(self, frame: dict) -> None:
        """Do what one host frame asks (:attr:`OPS`); an unknown op is ignored."""
        handler = self.OPS.get(frame.get("op"))  # type: ignore[arg-type]
        if handler is not None:
            handler(self, frame)

    def _op_msg(self, frame: dict) -> None:
        sock = self.sockets.get(frame["channel"])
        if sock is None or self.kernel is None:
            return
        buffers = [base64.b64decode(b) for b in frame.get("buffers", [])]
        self.session.send(sock, frame["msg"], buffers=list(buffers) or None)
        if frame["channel"] == "shell":
            self.executing.sent(frame["msg"])

    def _op_interrupt(self, frame: dict) -> None:
        if self.kernel is not None:
            self.executing.interrupted(time.monotonic())
            try:
                os.killpg(self.kernel.pid, signal.SIGINT)
            except OSError:
                pass

    def _op_ack(self, frame: dict) -> None:
        self.ack(int(frame["seq"]))

    def _op_replay(self, frame: dict) -> None:
        self.replay(int(frame["after"]))
        self.emit("replayed", after=int(frame["after"]))

    def _op_ping(self, frame: dict) -> None:
        self.emit("pong")

    def _op_keepalive(self, frame: dict) -> None:
        pass  # only resets the host-silence clock (_read_host)

    def _op_reseed(self, frame: dict) -> None:
        # restored from a start template: the interpreter reseeds (after_clone) before
        # its next Python instruction, so before the next request it handles; then the
        # completer is warmed again (a restored process faults in the pages it touches)
        if self.kernel is not None:
            try:
                os.kill(self.kernel.pid, RESEED_SIGNAL)
            except OSError:
                pass
            else:
                self.executing.copied()  # interrupted again until they end (.executing)
                self._warm_completer(relay_iopub=True)

    def _op_restart(self, frame: dict) -> None:
        self._kill_kernel()
        self.start_kernel()

    def _op_file(self, frame: dict) -> None:
        self.files.handle(frame)

    def _op_shutdown(self, frame: dict) -> None:
        self.running = False

    #: The host's ops (``sandbox_kernel.protocol.host_op_frame``) and their handlers.
    OPS: dict[str, Callable[[Agent, dict], None]] = {
        "msg": _op_msg, "interrupt": _op_interrupt, "ack": _op_ack, "replay": _op_replay,
        "ping": _op_ping, "keepalive": _op_keepalive, "reseed": _op_reseed,
        "restart": _op_restart, "file": _op_file, "shutdown": _op_shutdown,
    }

    def _read_host(self) -> bool:
        try:
            n = self.in_file.readinto(self.in_chunk)
        except BlockingIOError:
            return True
        except OSError:
            n = 0
        if n is None:
            return True  # nothing to read after all
        if not n:
            return False
        self.last_host_at = time.monotonic()
        self.inbuf += memoryview(self.in_chunk)[:n]
        while True:
            nl = self.inbuf.find(b"\n")
            if nl < 0:
                break
            line = bytes(self.inbuf[:nl])
            del self.inbuf[: nl + 1]
            if line.strip():
                self.handle_host_frame(json.loads(line))
        return True

    def relay_inner(self, name: str, sock) -> None:
        """Relay one message of the inner kernel to the host as a ``msg`` frame.

        The message is only relayed, so it is not deserialised: its signature is
        checked (as ``Session.deserialize`` does), ``parent_header`` is parsed (to
        recognise the agent's own probes), and the four JSON parts are spliced into
        the frame as they are when they already fit it (ASCII, one line, an object:
        what ``json.dumps`` makes of ASCII text).  Others are decoded and re-encoded
        with ``ensure_ascii``.  The host parses and checks every frame anyway.
        """
        frames = sock.recv_multipart()
        session = self.session
        try:
            parts = frames[frames.index(DELIM) + 1:]
            if len(parts) < 5:
                raise ValueError("malformed message, must have at least 5 elements")
            signature = parts[0]
            if not signature:
                raise ValueError("Unsigned Message")
            if signature in session.digest_history:
                raise ValueError(f"Duplicate Signature: {signature!r}")
            session._add_digest(signature)
            if not hmac.compare_digest(signature, session.sign(parts[1:5])):
                raise ValueError(f"Invalid Signature: {signature!r}")
            parent = json.loads(parts[2])
            if not isinstance(parent, dict):
                raise ValueError("parent_header is not an object")
            header, metadata, content = (ascii_json(parts[i]) for i in (1, 3, 4))
            parent_json = ascii_json(parts[2])
        except Exception as err:  # noqa: BLE001 - a cell can write garbage to our sockets
            self.emit("log", level="warning", text=f"bad message from inner kernel: {err}")
            return
        self.executing.seen(name, parent.get("msg_id"), header, content)
        if parent.get("msg_id") in self.own_msg_ids:
            # answers to the agent's own probes are not relayed; but ipykernel parents a
            # thread's output to the last request it handled, so after the warm-up of a copy
            # a thread of before prints under the agent's probe: relayed with no parent
            if name != "iopub" or msg_type(header) in (None, "status"):
                return
            parent_json = b"{}"
        buffers = b",".join(b'"' + base64.b64encode(b) + b'"' for b in parts[5:])
        self.seq += 1
        self._queue(b"".join((
            b'{"seq":%d,"op":"msg","channel":"%s","msg":{"header":' % (self.seq, name.encode("ascii")),
            header, b',"parent_header":', parent_json, b',"metadata":', metadata,
            b',"content":', content, b'},"buffers":[', buffers, b"]}\n")))

    def _current_poller(self):
        """The poller over stdin, the inner kernel's sockets and its stderr; rebuilt
        only when the inner kernel (and with it the sockets) changed."""
        if self.poller is None or self.poller_kernel is not self.kernel:
            zmq = self.zmq
            poller = zmq.Poller()
            poller.register(self.in_fd, zmq.POLLIN)
            for s in self.sockets.values():
                poller.register(s, zmq.POLLIN)
            if self.kernel is not None and self.kernel.stderr is not None:
                poller.register(self.kernel.stderr.fileno(), zmq.POLLIN)
            self.poller, self.poller_kernel = poller, self.kernel
        return self.poller

    def run(self) -> None:
        zmq = self.zmq
        os.set_blocking(self.in_fd, False)
        if self.kernel is None:
            self.start_kernel()
        else:
            self._connect_kernel()  # spawned first (__init__)
        while self.running:
            events = dict(self._current_poller().poll(200))
            if self.in_fd in events and not self._read_host():
                break  # host gone: dead-man's switch
            if self.host_silence_s and time.monotonic() - self.last_host_at > self.host_silence_s:
                sys.stderr.write(f"agent: no frame from the host for {self.host_silence_s:g} s: the proxy "
                                 "is gone; ending (dead-man's switch)\n")
                break
            # iopub first: a reply must never overtake the outputs it follows.
            # Frames relayed in this pass go out in one write.
            self.outq = []
            try:
                for name in ("iopub", "stdin", "shell", "control"):
                    s = self.sockets.get(name)
                    if s is not None and s in events:
                        while s.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                            self.relay_inner(name, s)
            finally:
                self.flush()
                self.outq = None
            # Each check is a few system calls (ptrace stops under gVisor): not on every pass.
            stderr = self.kernel.stderr if self.kernel is not None else None
            now = time.monotonic()
            if not events or now >= self.next_reap or (stderr is not None and stderr.fileno() in events):
                self.next_reap = now + REAP_INTERVAL_S
                self._drain_stderr()
                if self.kernel is not None and self.kernel.poll() is not None:
                    self._kernel_died()
                self._reap_orphans()
                self.executing.tick()
        self._kill_kernel()

    def _reap_orphans(self) -> None:
        """As PID 1, collect the exit status of orphaned processes (a daemonised
        ``!cmd &``, a pool worker that outlived its parent) so they do not stay
        zombies; the interpreter itself is left to :class:`subprocess.Popen`."""
        if os.getpid() != 1:
            return
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (ChildProcessError, OSError):
                return
            if info is None or (self.kernel is not None and info.si_pid == self.kernel.pid):
                return
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                return
