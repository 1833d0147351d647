"""Live kernels for the soak run and the faults injected into them (issue 16).

* :class:`Live` -- a started kernel (a ``KernelManager`` and a blocking client) with
  the request timer, the sandbox's identity (container id, state directory) and
  helpers to run a cell to its reply with a deadline.
* Checksummed output: :func:`print_cell` makes a cell whose every line carries its
  index and CRC-32, :func:`count_output` counts the lines that arrived intact and in
  order, and the bytes lost (unless a visible notice said why).
* :data:`FAULTS` -- what is done to a kernel: a runtime helper process killed
  (gVisor's gofer and sentry, bubblewrap's ``bwrap``), the agent stopped, the
  sandbox's cgroup removed, the client gone mid-cell (a new one connects), the proxy
  SIGKILLed mid-cell (the frontend restarts the kernel), a memory bomb, a fork bomb, an
  interrupt, and an idle period long enough to freeze or checkpoint the sandbox.  On the
  E2B and Modal emulations (:mod:`bench.emulation`) what a cloud can do instead of the
  local helpers' deaths: the sandbox's agent process killed, the sandbox hung, the
  sandbox ended by the service (its timeout), the service unreachable for a few
  seconds.  Each says which runtimes it applies to and what the affected cell must
  report; :func:`inject` runs one and returns a :class:`FaultResult`.

Every cell runs inside a sandbox; the faults act on the host processes of the
harness's own sandboxes only (found by their state directory, or through the
harness's own emulator), never on others.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cells import Timer
from bench.emulation import EMULATED, Emulation

#: A fault must end the affected cell with an error within this many seconds (never a hang).
FAULT_DEADLINE_S = 45.0
#: After a fault the kernel must answer ``1 + 1`` within this many seconds (a fresh sandbox).
RECOVERY_DEADLINE_S = 120.0


def print_cell(n: int, width: int = 100, tag: str = "") -> str:
    """A cell printing ``n`` lines ``<tag><index> <payload> <crc32>`` (about ``width`` bytes each)."""
    return (
        "import zlib as _z\n"
        f"for _i in range({n}):\n"
        f"    _p = '{tag}' + f'{{_i:06d}} ' + ('abcdefghij' * {max(1, width // 10)})[:{width}]\n"
        "    print(_p, _z.crc32(_p.encode()), flush=(_i % 50 == 0))\n")


def _expected_line(i: int, width: int, tag: str) -> str:
    p = f"{tag}{i:06d} " + ("abcdefghij" * max(1, width // 10))[:width]
    return f"{p} {zlib.crc32(p.encode())}\n"


_LINE = re.compile(r"^(?P<p>(?P<tag>\S*?)(?P<i>\d{6}) [a-j]+) (?P<crc>\d+)$")


@dataclass
class OutputCount:
    """What :func:`count_output` found: lines expected and intact, bytes lost, order."""

    expected_lines: int
    intact_lines: int
    expected_bytes: int
    lost_bytes: int
    in_order: bool
    cut_notice: str = ""


def count_output(stdout: str, stderr: str, n: int, width: int = 100, tag: str = "") -> OutputCount:
    """Count the lines of a :func:`print_cell` cell that arrived intact (CRC) and in order.

    Bytes missing are "lost" unless the proxy said it cut them (its output-cap notice
    on stderr), which is then kept in :attr:`OutputCount.cut_notice`.
    """
    seen: list[int] = []
    intact_bytes = 0
    for line in stdout.splitlines():
        m = _LINE.match(line)
        if m and m["tag"] == tag and zlib.crc32(m["p"].encode()) == int(m["crc"]):
            seen.append(int(m["i"]))
            intact_bytes += len(line) + 1
    line_bytes = [len(_expected_line(i, width, tag)) for i in range(n)]
    expected = sum(line_bytes)
    notice = next((ln for ln in stderr.splitlines() if "output limit reached" in ln or "dropped" in ln), "")
    lost = 0 if notice else max(0, expected - intact_bytes)
    return OutputCount(n, len(set(seen)), expected, lost, seen == sorted(seen) and len(seen) == len(set(seen)),
                       notice)


@dataclass
class Reply:
    """A cell's end as the client saw it."""

    status: str
    ename: str
    evalue: str
    seconds: float
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict] = field(default_factory=list)


class Live:
    """A started kernel on one runtime (by kernelspec name) with a connected client."""

    def __init__(self, kernel_name: str, runtime: str, log=None, env: dict[str, str] | None = None):
        from jupyter_client.manager import KernelManager
        self.runtime = runtime
        self.kernel_name = kernel_name
        #: ``sandbox-kernel-<kernel id>-`` of every proxy this kernel had (a restart makes a new one).
        self.prefixes: set[str] = set()
        self.km = KernelManager(kernel_name=kernel_name)
        kw: dict[str, Any] = {"stdout": log, "stderr": log} if log is not None else {}
        if env:  # e.g. the SDK pointed at one emulator; kept for the frontend's restarts
            kw["env"] = {**os.environ, **env}
        self.km.start_kernel(**kw)
        self.connect()

    def connect(self) -> None:
        """A (new) client for the kernel: what a frontend that reconnects does."""
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=180)
        self.timer = Timer(self.kc)
        cid = self.container_id
        if cid:
            self.prefixes.add(cid.rsplit("-", 1)[0] + "-")

    def info(self, timeout: float = 60.0) -> dict:
        """``kernel_info``'s ``sandbox`` field (never wakes the sandbox)."""
        _, reply = self.timer.request(self.kc.kernel_info, wait_idle=False, timeout=timeout)
        return reply["content"]["sandbox"]

    @property
    def container_id(self) -> str:
        return str(self.info().get("container_id", ""))

    def state_dir(self, base: Path) -> Path:
        return base / self.container_id

    def run(self, code: str, timeout: float = 120.0, stdin: Callable[[str], str] | None = None,
            on_started: Callable[[], None] | None = None, started_marker: str = "") -> Reply:
        """Send ``code``, wait for its execute_reply and idle; ``stdin`` answers ``input()``;
        ``on_started`` is called once the cell printed ``started_marker`` (so a fault is
        injected while the cell surely runs, not after a guess)."""
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=False, allow_stdin=stdin is not None)
        reply, idle, outs = None, False, []
        out, err = [], []
        fired = on_started is None
        deadline = t0 + timeout
        while reply is None or not idle:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no reply in {timeout:.0f} s: {code[:60]!r}")
            if stdin is not None:
                try:
                    req = self.kc.get_stdin_msg(timeout=0.001)
                    self.kc.input(stdin(req["content"]["prompt"]))
                except queue.Empty:
                    pass
            try:
                m = self.kc.get_iopub_msg(timeout=0.02)
                if m["parent_header"].get("msg_id") == msg_id:
                    if m["msg_type"] == "status":
                        idle = idle or m["content"]["execution_state"] == "idle"
                    else:
                        outs.append(m)
                        if m["msg_type"] == "stream":
                            (out if m["content"]["name"] == "stdout" else err).append(m["content"]["text"])
                            if not fired and started_marker in "".join(out):
                                fired = True
                                assert on_started is not None
                                on_started()
            except queue.Empty:
                pass
            if reply is None:
                try:
                    r = self.kc.get_shell_msg(timeout=0.001)
                    if r["parent_header"].get("msg_id") == msg_id:
                        reply = r
                        dt = time.perf_counter() - t0
                except queue.Empty:
                    pass
        c = reply["content"]
        return Reply(c["status"], str(c.get("ename", "")), str(c.get("evalue", "")), dt,
                     "".join(out), "".join(err), outs)

    def rtt(self, timeout: float = 60.0) -> float:
        """Seconds to the execute_reply of ``x += 1`` (the quiet kernels' latency sample)."""
        dt, reply = self.timer.request(lambda: self.kc.execute("x += 1", store_history=False),
                                       wait_idle=True, timeout=timeout)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{reply['content'].get('ename')}: {reply['content'].get('evalue')}")
        return dt

    def stop(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=False)


# ---- the host processes of one sandbox --------------------------------------------------------


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def helper_pids(state_dir: Path) -> dict[str, list[int]]:
    """The runtime's host processes of the sandbox in ``state_dir``: ``gofer``, ``sentry``
    (gVisor's ``runsc-gofer``/``runsc-sandbox``), ``runsc`` (``runsc run``/``restore``),
    ``bwrap``, ``agent`` (bubblewrap: the agent, a host process in the namespace)."""
    from sandbox_kernel.backends.local.procs import descendants, processes_mentioning
    out: dict[str, list[int]] = {"gofer": [], "sentry": [], "runsc": [], "bwrap": [], "agent": []}
    for pid in processes_mentioning(str(state_dir)):
        argv = _cmdline(pid)
        name = os.path.basename(argv[0]) if argv else ""
        if name == "runsc-gofer":
            out["gofer"].append(pid)
        elif name == "runsc-sandbox":
            out["sentry"].append(pid)
        elif name == "runsc":
            out["runsc"].append(pid)
        elif name == "bwrap":
            out["bwrap"].append(pid)
            for child in descendants(pid)[1:]:
                if any(a.endswith("agent.pyz") for a in _cmdline(child)) and not out["agent"]:
                    out["agent"].append(child)
    return out


def _signal(pids: list[int], sig: int) -> None:
    if not pids:
        raise RuntimeError("no such process to signal")
    for pid in pids:
        os.kill(pid, sig)


# ---- the faults ---------------------------------------------------------------------------------

#: A long cell that says when it started and prints a checksummed line every 0.1 s.
LONG_CELL = ("import time, zlib\nprint('STARTED', flush=True)\n"
             "for _i in range(300):\n"
             "    _p = f'{_i:06d} abcdefghij'\n"
             "    print(_p, zlib.crc32(_p.encode()), flush=True)\n"
             "    time.sleep(0.1)\n")


@dataclass
class Fault:
    """One kind of fault.

    Attributes
    ----------
    name : str
    runtimes : tuple of str
        Where it applies: local runtimes, and the emulations (:data:`EMULATED`).
    inject : callable or None
        ``inject(live, where)`` while :data:`LONG_CELL` runs (``where``: the sandbox's
        state directory, or the :class:`~bench.emulation.Emulation` it runs in); None
        for the faults that are a cell of their own (``cell``).
    cell : str
        The cell that is the fault (a bomb), or "" for :data:`LONG_CELL`.
    expect : tuple of str
        The affected cell's error must contain one of these (case-insensitive): the cause.
    """

    name: str
    runtimes: tuple[str, ...]
    inject: Callable[[Live, Any], None] | None
    cell: str = ""
    expect: tuple[str, ...] = ()
    #: The cell may also end ``ok`` (a fork bomb the pids limit contains).
    ok_allowed: bool = False
    #: The cell must end ``ok`` (nothing went wrong: a wake from an idle level).
    ok_required: bool = False
    #: The kernel's recovery is checked no sooner than this long after the fault (the
    #: next cell after an outage is sent once the service is back).
    recover_after_s: float = 0.0


def _kill(role: str, sig: int = signal.SIGKILL) -> Callable[[Live, Path], None]:
    def inject(live: Live, state_dir: Path) -> None:
        _signal(helper_pids(state_dir)[role], sig)
    return inject


def _stop_agent(live: Live, state_dir: Path) -> None:
    pids = helper_pids(state_dir)
    # gVisor: the agent runs inside the sentry; stopping the sentry stops it (and all else)
    _signal(pids["agent"] if live.runtime == "bubblewrap" else pids["sentry"], signal.SIGSTOP)


def _remove_cgroup(live: Live, state_dir: Path) -> None:
    from sandbox_kernel.backends.local.cgroups import SandboxCgroup
    cg = SandboxCgroup.existing(state_dir.name)
    if cg is None:
        raise RuntimeError(f"no cgroup {state_dir.name}")
    cg.kill_all()
    cg.remove()


def _client_gone(live: Live, state_dir: Path) -> None:
    """The client goes away mid-cell (no reply read); a new one connects."""
    live.kc.stop_channels()
    live.connect()


MEMORY_BOMB = "l = []\nwhile True: l.append(bytearray(16 * 1024**2))"
FORK_BOMB = ("import os, time\nkids = []\n"
             "try:\n"
             "    while len(kids) < 5000:\n"
             "        pid = os.fork()\n"
             "        if pid == 0:\n"
             "            time.sleep(30); os._exit(0)\n"
             "        kids.append(pid)\n"
             "except (BlockingIOError, OSError) as e: print('refused after', len(kids), e)\n"
             "for k in kids: os.kill(k, 9)\n"
             "for k in kids: os.waitpid(k, 0)\n")
SIGNALLED = ("killed by signal", "sandbox ended", "exited with code", "stopped answering", "sandbox exited",
             "runtime process ended", "channel", "restarted", "memory limit")
LOCAL = ("gvisor", "bubblewrap")
CLOUD = tuple(EMULATED)
EVERYWHERE = LOCAL + CLOUD
#: Seconds an emulated service stays unreachable (``service-outage``).
OUTAGE_S = 4.0


def _cloud(verb: str) -> Callable[[Live, Any], None]:
    """A fault done by the emulated service; ``where`` is ``(emulation, sandbox id)``, the
    id read before the cell started (a request now would take the cell's messages)."""
    def inject(live: Live, where: tuple[Emulation, str]) -> None:
        emu, sandbox_id = where
        if verb == "outage":
            emu.outage(OUTAGE_S)
        elif not sandbox_id:
            raise RuntimeError("the kernel reported no sandbox_id")
        else:
            getattr(emu, verb)(sandbox_id)
    return inject


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("sigkill-gofer", ("gvisor",), _kill("gofer"), expect=SIGNALLED),
    Fault("sigkill-sentry", ("gvisor",), _kill("sentry"), expect=SIGNALLED),
    Fault("sigkill-bwrap", ("bubblewrap",), _kill("bwrap"), expect=SIGNALLED),
    Fault("sigstop-agent", LOCAL, _stop_agent, expect=("silent", "no frame", "answer")),
    Fault("cgroup-removed", LOCAL, _remove_cgroup, expect=SIGNALLED),
    # the cloud's own: the agent's process dies inside the VM/container, the sandbox hangs,
    # the service ends it (its timeout), the service is unreachable for a while
    Fault("agent-killed", CLOUD, _cloud("kill_agent"), expect=SIGNALLED),
    Fault("sandbox-hung", CLOUD, _cloud("freeze"), expect=("silent", "no frame", "answer")),
    Fault("sandbox-terminated", CLOUD, _cloud("terminate"), expect=("ended", "gone", "timed out")),
    Fault("service-outage", CLOUD, _cloud("outage"), expect=("connection", "unavailable", "stream"),
          ok_allowed=True, recover_after_s=OUTAGE_S),
    Fault("client-gone", EVERYWHERE, _client_gone, ok_allowed=True),
    Fault("proxy-killed", EVERYWHERE, None, expect=("died",)),
    Fault("frontend-restart", EVERYWHERE, None, expect=("shutting down",)),
    Fault("idle-then-wake", EVERYWHERE, None, ok_allowed=True, ok_required=True),
    Fault("memory-bomb", EVERYWHERE, None, MEMORY_BOMB, expect=("memory limit", "MemoryError")),
    # not on the emulations: their sandboxes share the host's uid 65534 and have no pids
    # limit of their own, so a fork bomb would measure this machine, not the cloud's VM
    Fault("fork-bomb", LOCAL, None, FORK_BOMB, expect=SIGNALLED, ok_allowed=True),
    Fault("interrupt", EVERYWHERE, lambda live, _: live.km.interrupt_kernel(),
          expect=("KeyboardInterrupt",)),
)}


@dataclass
class FaultResult:
    """What one injected fault did, as the harness judged it."""

    fault: str
    runtime: str
    survived: bool
    seconds_to_error: float | None
    message: str
    why: str = ""
    #: A cloud sandbox this fault left behind on purpose: the one whose proxy was
    #: SIGKILLed (``proxy-killed``), which the cloud's dead-man's switch ends.
    orphan: str = ""


def inject(live: Live, fault: Fault, base: Path | Emulation) -> FaultResult:
    """Inject ``fault`` into ``live`` and judge it: the affected cell ends within
    :data:`FAULT_DEADLINE_S` with an error naming the cause (``fault.expect``), and the
    kernel answers ``1 + 1`` afterwards (a fresh sandbox where the old one ended).

    ``base`` is the run's state directory (local runtimes) or the emulation the
    kernel's sandboxes run in."""
    state_dir: Any = (live.state_dir(base) if isinstance(base, Path)
                      else (base, str(live.info().get("sandbox_id", ""))))
    injected_at: list[float] = []

    def now() -> None:
        injected_at.append(time.perf_counter())
        assert fault.inject is not None
        fault.inject(live, state_dir)

    try:
        if fault.inject is None and fault.cell:
            t0 = time.perf_counter()
            r = live.run(fault.cell, timeout=FAULT_DEADLINE_S + 60)
            t_fault = t0
        elif fault.name == "proxy-killed":
            r, t_fault = _proxy_killed(live)
        elif fault.name == "idle-then-wake":
            r, t_fault = _idle_then_wake(live)
        elif fault.name == "frontend-restart":
            r, t_fault = _frontend_restart(live)
        elif fault.name == "client-gone":
            msg_id = live.kc.execute(LONG_CELL.replace("range(300)", "range(20)"))
            _wait_output(live, msg_id, "STARTED")
            t_fault = time.perf_counter()
            _client_gone(live, state_dir)
            r = live.run("'back'", timeout=FAULT_DEADLINE_S)  # queued behind the first cell
        else:
            r = live.run(LONG_CELL, timeout=FAULT_DEADLINE_S, on_started=now, started_marker="STARTED")
            t_fault = injected_at[0] if injected_at else time.perf_counter()
    except TimeoutError as err:
        return FaultResult(fault.name, live.runtime, False, None, "", f"hang: {err}")
    except Exception as err:
        return FaultResult(fault.name, live.runtime, False, None, "", f"{type(err).__name__}: {err}")
    dt = time.perf_counter() - t_fault
    message = (f"{r.ename}: {r.evalue}" if r.status == "error"
               else f"ok: {r.stdout[-200:].strip()} {r.stderr[-200:].strip()}".strip())
    why = ""
    if r.status != "ok" and fault.ok_required:
        why = f"the cell failed: {message[:120]}"
    elif r.status == "ok" and not fault.ok_allowed:
        why = "the cell ended ok: the fault went unnoticed"
    elif r.status == "error" and fault.expect and not any(e.lower() in message.lower() for e in fault.expect):
        why = f"the error does not name the cause (wanted one of {fault.expect})"
    time.sleep(max(0.0, t_fault + fault.recover_after_s - time.perf_counter()))
    try:
        back = live.run("1 + 1", timeout=RECOVERY_DEADLINE_S)
        if back.status != "ok":
            why = why or f"the kernel did not recover: {back.ename}: {back.evalue}"
    except TimeoutError as err:
        why = why or f"the kernel did not recover: {err}"
    orphan = state_dir[1] if fault.name == "proxy-killed" and isinstance(state_dir, tuple) else ""
    return FaultResult(fault.name, live.runtime, not why, round(dt, 2), message[:300], why, orphan)


def _proxy_killed(live: Live) -> tuple[Reply, float]:
    """SIGKILL the proxy mid-cell (no cleanup runs in it); the frontend sees the kernel
    die and restarts it, as Jupyter Server's restarter does.  The old sandbox is left to
    its watchdog: the run's leftovers check sees whether it went."""
    msg_id = live.kc.execute(LONG_CELL)
    _wait_output(live, msg_id, "STARTED")
    pid = live.km.provisioner.pid  # type: ignore[union-attr]
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    deadline = t0 + FAULT_DEADLINE_S
    while live.km.is_alive():
        if time.perf_counter() > deadline:
            raise TimeoutError("the killed proxy still looks alive")
        time.sleep(0.05)
    dt = time.perf_counter() - t0
    live.kc.stop_channels()
    live.km.restart_kernel(now=True)
    live.connect()
    return Reply("error", "KernelDied", "the kernel process died and was restarted by the frontend", dt), t0


def _frontend_restart(live: Live) -> tuple[Reply, float]:
    """The frontend restarts the kernel (Jupyter's restart button: ``shutdown_request``
    with ``restart=True``, then a new kernel process) while a cell runs and another waits
    behind it (``stop_on_error=False``).  Both cells must get a reply naming the
    shutdown before the old process ends (a frontend would otherwise show them running
    forever); the new kernel answers; the old sandbox must be gone (the run's leftover
    check, and nothing may start one once the shutdown began).

    jupyter_client interrupts a kernel before it asks it to restart: a cell that SIGINT
    ends would race its own ``KeyboardInterrupt`` reply against the shutdown's (a CI run
    saw the interrupt's win once on gVisor).  The running cell ignores SIGINT, as one
    stuck in C code would, so the shutdown is what ends it, every time (as in
    ``tests/test_fleet.py``)."""
    msg_id = live.kc.execute("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + LONG_CELL)
    queued = live.kc.execute("print('queued cell ran')", stop_on_error=False)
    _wait_output(live, msg_id, "STARTED")
    t0 = time.perf_counter()
    live.km.restart_kernel(now=False)
    dt = time.perf_counter() - t0
    replies: dict[str, dict] = {}
    deadline = time.perf_counter() + 5
    while len(replies) < 2 and time.perf_counter() < deadline:
        try:
            m = live.kc.get_shell_msg(timeout=0.1)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") in (msg_id, queued):
            replies[m["parent_header"]["msg_id"]] = m["content"]
    live.kc.stop_channels()
    live.connect()
    first, second = replies.get(msg_id, {}), replies.get(queued, {})
    if not first or not second:
        missing = [n for n, c in (("running", first), ("queued", second)) if not c]
        return Reply("error", "NoReply", f"no reply for the {' and '.join(missing)} cell before the restart", dt), t0
    if second.get("status") == "ok":
        return Reply("error", "QueuedCellRan", "the queued cell ran although the kernel was shutting down", dt), t0
    return Reply(str(first.get("status")), str(first.get("ename", "")),
                 f"{first.get('evalue', '')} | queued cell: {second.get('status')}", dt), t0


#: The idle level the misbehaving kernels reach (their kernelspec's pause/checkpoint/stop
#: times): frozen or checkpointed, state kept; Modal without memory snapshots stops the
#: sandbox (state lost, and the next cell says so).
IDLE_LEVEL = {"gvisor": "checkpointed", "bubblewrap": "paused", "e2b-emulated": "paused",
              "modal-emulated": "stopped"}


def _idle_then_wake(live: Live) -> tuple[Reply, float]:
    """Leave the kernel idle until it reaches its :data:`IDLE_LEVEL`, then run a cell: the
    variable set before must be there and the wake told in the cell; after a stop the
    variable is gone and the cell says state was lost."""
    live.run("idle_x = 123")
    want = IDLE_LEVEL[live.runtime]
    deadline = time.perf_counter() + 120
    while live.info()["state"] != want:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the kernel never became {want}")
        time.sleep(0.2)
    t0 = time.perf_counter()
    r = live.run("print(globals().get('idle_x'))")
    got = r.stdout.strip()
    if want == "stopped":
        told, kept = "state was lost" in r.stderr, got == "None"
    else:
        told = "restored from a checkpoint" in r.stderr or "resumed from pause" in r.stderr
        kept = got == "123"
    if r.status == "ok" and not (kept and told):
        return Reply("error", "StateLost" if want != "stopped" else "NotTold",
                     f"after {want}: idle_x is {got!r}; stderr {r.stderr[-200:]!r}", r.seconds), t0
    return r, t0


def _wait_output(live: Live, msg_id: str, marker: str, timeout: float = 60.0) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            m = live.kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"
                and marker in m["content"]["text"]):
            return
    raise TimeoutError(f"{marker!r} never came")
