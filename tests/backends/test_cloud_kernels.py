"""The cloud backends through the real proxy kernel and ``jupyter_client``.

Kernelspecs are installed with ``backend="e2b"`` / ``backend="modal"``; the
emulator of that cloud runs in this process on 127.0.0.1 (fixtures in
``conftest.py``), and the proxy process finds it through the environment it
inherits (``E2B_API_URL``, ``E2B_SANDBOX_URL``, ``E2B_API_KEY``;
``MODAL_SERVER_URL``, ``MODAL_TOKEN_ID``/``SECRET``), as a proxy started by
Jupyter would find real credentials.  Every cell runs in bubblewrap behind the
emulator, never on the host.

Per backend: the lifecycle script (start, execute, interrupt, idle pause or
stop, resume, execute, shutdown leaves no sandbox), credentials never reaching
the sandbox, cases C04-C08 (``../shared/cases/kernel-behaviour.md``), C10, and
on E2B C11 (five pause/resume cycles) plus output produced around a pause
arriving exactly once, in order (the relay's reattach and ``replay``).
"""

from __future__ import annotations

import os
import queue
import re
import time

import pytest

pytest.importorskip("e2b_code_interpreter")
pytest.importorskip("modal")


# tests/conftest.py (the kernel harness) and tests/test_cases.py (the local case checks);
# tests/backends is a package, so its own conftest is ``backends.conftest``.
from kernels import Kernel, control
from sandbox_kernel.kernelspec import install, kernel_dict
from test_cases import Cells, _one_png, error_text

#: Idle seconds before the E2B sandbox is paused / the Modal sandbox is stopped.
IDLE_S = 1.5


@pytest.fixture
def cloud_spec(kernelspec_prefix):
    """Install a kernelspec for a cloud backend; returns its name."""

    def _install(backend: str, variant: str, **options) -> str:
        name = f"sandbox-test-{backend}-{variant}"
        install(name, backend=backend, options=options, prefix=kernelspec_prefix)
        return name

    return _install


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def probe_secrets(k: Kernel, secrets: list[str]) -> str:
    """A cell listing E2B_*/MODAL_* names, and any secret in its environment or in
    any process's ``/proc/*/environ`` inside the sandbox.  The secrets travel
    reversed, so the cell's own source (and IPython's history) never holds them."""
    code = (
        "import os\n"
        f"secrets = [s[::-1] for s in {[s[::-1] for s in secrets]!r}]\n"
        "names = sorted(k for k in os.environ if k.startswith(('E2B_', 'MODAL_')))\n"
        "vals = sorted(k for k, v in os.environ.items() if any(s in v for s in secrets))\n"
        "procs = []\n"
        "for p in os.listdir('/proc'):\n"
        "    try:\n"
        "        data = open(f'/proc/{p}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if any(s.encode() in data for s in secrets):\n"
        "        procs.append(p)\n"
        "print(names, vals, procs)")
    r = k.execute(code, timeout=60)
    assert r.status == "ok", error_text(r)
    return r.stdout.strip()


def wait_gone(pred, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def lifecycle_start(k: Kernel, backend: str, secrets: list[str]) -> dict:
    """Start, execute, credentials check, interrupt; returns kernel_info's sandbox."""
    info = k.sandbox_info()
    assert info["backend"] == backend and info["state"] == "running", info
    assert probe_secrets(k, secrets) == "[] [] []"
    r = k.execute("x = 41; x + 1")
    assert r.result_text == "42", error_text(r)
    r = k.execute("import time; time.sleep(30)", interrupt_after=1.0, timeout=30)
    assert r.ename == "KeyboardInterrupt", error_text(r)
    assert r.after_interrupt_s < 5.0, r.after_interrupt_s
    assert k.execute("x").result_text == "41"
    return info


def run_cases_c04_to_c08(k: Kernel) -> None:
    """C04-C08 through the proxy, as tests/test_cases.py checks them locally."""
    c = Cells(k)
    # C04: one display_data with image/png and text/plain; savefig; figure as last expression
    r = c.run('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.title("t"); plt.show()')
    assert r.status == "ok", error_text(r)
    assert len(r.of_type("display_data")) == 1 and _one_png(r)["msg_type"] == "display_data"
    r = c.run("%matplotlib inline\nplt.plot([1, 2]); plt.show()")
    _one_png(r)
    r = c.run('import os\nplt.plot([1, 2]); plt.savefig("fig.png"); plt.close()\n'
              'os.path.getsize("fig.png") > 1000')
    assert r.result_text == "True", error_text(r)
    r = c.run("fig, ax = plt.subplots(); ax.plot([3, 1]); plt.close(fig); fig")
    assert _one_png(r)["msg_type"] == "execute_result"
    # C05: input() reaches a frontend that allows stdin; fails at once without
    r = c.run('name = input("name? "); print("hi", name)', allow_stdin=True, stdin=lambda req: "Ada")
    assert r.stdout == "hi Ada\n", error_text(r)
    r = c.run("import getpass; print(len(getpass.getpass()))", allow_stdin=True,
              stdin=lambda req: "s3cret")
    assert r.stdout.strip().endswith("6"), error_text(r)
    r = c.run('input("name? ")', allow_stdin=False, timeout=30)
    assert r.ename == "StdinNotImplementedError" and r.elapsed_s < 5, (r.ename, r.elapsed_s)
    # C06: interrupts keep the kernel and the state, repeatedly
    assert c.run("x = 42").status == "ok"
    for code in ("while True: pass", "import time\nwhile True: time.sleep(1)",
                 "import asyncio\nawait asyncio.sleep(3600)", "while True: pass", "while True: pass"):
        r = c.run(code, interrupt_after=1, timeout=30)
        assert r.ename == "KeyboardInterrupt", (code, error_text(r))
        assert r.after_interrupt_s < 2.0, (code, r.after_interrupt_s)
        assert c.run("x").result_text == "42", code
    # C07: byte-exact, complete, ordered; outputs before the reply
    assert c.run('print("Hello, World")').stdout == "Hello, World\n"
    r = c.run("for i in range(20000): print(i)")
    assert r.stdout == "".join(f"{i}\n" for i in range(20000))
    r = c.run('import sys; sys.stdout.write("tail-without-newline")')
    assert r.stdout == "tail-without-newline" and r.result_text == "20"
    r = c.run("!seq 1 5000")
    assert r.stdout == "".join(f"{i}\n" for i in range(1, 5001))
    # C08: multi-byte characters split at the file-descriptor level
    text = "café☕日本語"
    r = c.run(f"import os, time\nb = {text!r}.encode()\n"
              "os.write(1, b[:4]); time.sleep(0.2); os.write(1, b[4:])")
    assert r.stdout == text
    assert c.run('print("é" * 100000)').stdout == "é" * 100000 + "\n"
    r = c.run("!printf 'caf\\xc3'; sleep 0.2; printf '\\xa9\\n'")
    assert r.stdout.replace("\r\n", "\n") == "café\n", r.stdout + r.stderr
    c.check()


# ---------------------------------------------------------------------------
# kernelspec options
# ---------------------------------------------------------------------------


def test_kernelspec_options_survive_the_command_line():
    """Options of every type (bool, None, lists with spaces and quotes, a dict, floats) reach
    the kernel's and the backend's traits intact through kernelspec argv."""
    from sandbox_kernel.app import SandboxKernelApp
    from sandbox_kernel.backends.modal import ModalBackend
    from sandbox_kernel.options import KernelOptions
    from traitlets.config import Config, Configurable

    class Options(KernelOptions, Configurable):
        pass

    spec = kernel_dict("modal", {"memory_snapshots": False, "gpu": None, "packages": ["a b", 'q"'],
                                 "idle_timeout_s": 120, "env": {"A": "1 2", "B": "true"},
                                 "ro_paths": ("/a b", "/c"), "pause_after_s": 1.5})
    app = SandboxKernelApp()
    app.parse_command_line(spec["argv"][spec["argv"].index("{connection_file}") + 1:])
    assert app.config.SandboxKernel.backend == "modal"
    cfg = Config(app.config)
    cfg.Options = app.config.SandboxKernel
    policy = Options(config=cfg).build_policy()
    assert policy.env == (("A", "1 2"), ("B", "true")) and policy.ro_paths == ("/a b", "/c")
    assert policy.pause_after_s == 1.5
    m = ModalBackend(policy, "k", config=app.config)
    assert (m.memory_snapshots, m.gpu, m.packages, m.idle_timeout_s) == (False, None, ["a b", 'q"'], 120)


# ---------------------------------------------------------------------------
# E2B
# ---------------------------------------------------------------------------


def test_e2b_lifecycle_c10_c11_and_replay(e2b_emulator, cloud_spec):
    emu = e2b_emulator.emu
    name = cloud_spec("e2b", "idle", pause_after_s=IDLE_S, checkpoint_after_s=0, stop_after_s=0,
                      deadman_s=120, request_timeout_s=30.0)
    secrets = [os.environ["E2B_API_KEY"], emu.api_url, emu.sandbox_url]
    k = Kernel(name)
    try:
        info = lifecycle_start(k, "e2b", secrets)
        assert info["idle"]["plan"] == [["pause", IDLE_S]]
        assert info["unenforced"] == ["memory_mib", "cpu_cores", "pids_max", "scratch_mib"]
        vm = emu.vms[info["sandbox_id"]]
        assert vm.metadata["kernel_id"] and vm.allow_internet is False

        # C10: idle -> paused with memory kept; the next cell resumes and finds x
        info = k.wait_state("paused")
        assert vm.state == "paused"
        r = k.execute("x")
        assert r.result_text == "41", error_text(r)
        assert "resumed from pause" in r.stderr and "state was lost" not in r.stderr
        info = k.sandbox_info()
        assert info["state"] == "running" and info["timings_s"]["resume_s"] > 0
        assert info["idle"]["counts"] == {"pause": 1, "resume": 1}
        assert info["sandbox_id"] == vm.sandbox_id  # the same sandbox, not a new one

        # C11: five pause/resume cycles in a row, memory and files intact each time
        r = k.execute('x = 41; open("f.txt", "w").write("a")')
        assert r.status == "ok", error_text(r)
        resumes = []
        for n in range(5):
            k.wait_state("paused")
            r = k.execute("x += 1; x, open('f.txt').read()")
            assert r.result_text == f"({42 + n}, 'a')", error_text(r)
            resumes.append(k.sandbox_info()["timings_s"]["resume_s"])
        assert k.sandbox_info()["idle"]["counts"] == {"pause": 6, "resume": 6}
        print("E2B resume latencies through the proxy (s):", resumes)

        # Output made while the proxy is detached for a pause (E2B drops it) arrives once, in
        # order, after the resume.  Output is activity, so a thread that prints keeps the
        # sandbox awake: this one waits silently; the emulation's pause, once it has dropped
        # the streams, tells it to print (pause_hold) and freezes the VM when it has.
        emu.pause_hold = ("/tmp/.pausing", "/tmp/.printed")
        ticks_id = k.kc.execute(
            "import os, threading, time\n"
            "def _tick():\n"
            "    while not os.path.exists('/tmp/.pausing'):\n"
            "        time.sleep(0.02)\n"
            "    for i in range(60):\n"
            "        print('tick', i, flush=True)\n"
            "    time.sleep(0.5)\n"  # ipykernel's IO thread sends them on (every 0.2 s)
            "    open('/tmp/.printed', 'w').close()\n"
            "threading.Thread(target=_tick).start()")
        got: list[str] = []
        wake_ids: list[str] = []

        def pump(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    m = k.kc.get_iopub_msg(timeout=0.05)
                except queue.Empty:
                    continue
                # the inner ipykernel gives a thread's output the parent of the cell
                # running at the time: the ticks' own cell, then a wake-up cell
                if (m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
                        and m["parent_header"].get("msg_id") in (ticks_id, *wake_ids)):
                    got.append(m["content"]["text"])

        deadline = time.monotonic() + 30
        while k.sandbox_info()["state"] != "paused":
            assert time.monotonic() < deadline, "never paused"
            pump(0.1)
        assert not got, "the ticks were made while detached: none arrives before the resume"
        emu.pause_hold = None
        deadline = time.monotonic() + 60
        while "tick 59" not in "".join(got):
            assert time.monotonic() < deadline, "".join(got)[-200:]
            if k.sandbox_info()["state"] == "paused":  # (again, on a slow machine): wake it
                wake_ids.append(k.kc.execute("1"))
            pump(0.2)
        pump(0.5)  # duplicates would come now
        lines = "".join(got).splitlines()
        assert lines == [f"tick {i}" for i in range(60)], (len(lines), lines[:3], lines[-3:])
        replies = k.other_replies
        while not set(wake_ids) <= set(replies):  # the wake-up cells' replies
            r = k.kc.get_shell_msg(timeout=30)
            replies[r["parent_header"].get("msg_id")] = r
        assert all(replies[w]["content"]["status"] == "ok" for w in wake_ids)
    finally:
        emu.pause_hold = None  # (the emulation is the module's)
        k.shutdown()
    # shutdown leaves no emulated sandbox
    assert wait_gone(lambda: not emu.vms), list(emu.vms)
    assert not vm.state_dir.exists()


def test_e2b_a_cut_stream_is_reattached_state_and_output_kept(e2b_emulator, cloud_spec):
    """E2B's edge down for 3 s while a cell prints (every stream cut, every request 503;
    the sandbox runs on): the backend waits until E2B says the sandbox runs, reattaches
    to the agent, and the agent replays what the cut lost. The cell ends ok with every
    line once and in order, and the variable set before is still there.  Input takes
    0.3 s to reach the sandbox and the cell prints every 20 ms, so lines reach the new
    stream before the agent reads the ``replay`` request (ahead of the frame due:
    dropped, then replayed in turn), as they did in the soak."""
    emu = e2b_emulator.emu
    k = Kernel(cloud_spec("e2b", "cut", deadman_s=120, request_timeout_s=5.0))
    try:
        assert k.execute("x = 41").status == "ok"
        msg_id = k.kc.execute("import time\nfor i in range(400):\n    print(i, flush=True)\n    time.sleep(0.02)")
        time.sleep(1.5)
        emu.input_delay_s = 0.3
        e2b_emulator.loop.call_soon_threadsafe(emu.outage, 3.0)
        reply = k.kc.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = k.kc.get_shell_msg(timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        out = ""
        while True:
            try:
                m = k.kc.get_iopub_msg(timeout=5)
            except queue.Empty:
                break
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
                out += m["content"]["text"]
            if (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                    and m["content"]["execution_state"] == "idle"):
                break
        assert out.split() == [str(i) for i in range(400)], out
        r = k.execute("x + 1")
        assert r.result_text == "42", error_text(r)
        assert len(emu.vms) == 1  # the same sandbox, not a fresh one
    finally:
        emu.input_delay_s = 0.0
        k.shutdown()
    assert wait_gone(lambda: not emu.vms), list(emu.vms)


def test_e2b_cases_c04_to_c08(e2b_emulator, cloud_spec):
    emu = e2b_emulator.emu
    k = Kernel(cloud_spec("e2b", "plain"))
    try:
        run_cases_c04_to_c08(k)
    finally:
        k.shutdown()
    assert wait_gone(lambda: not emu.vms), list(emu.vms)


# ---------------------------------------------------------------------------
# Modal
# ---------------------------------------------------------------------------


def test_modal_lifecycle_and_c10(modal_emulator, cloud_spec):
    name = cloud_spec("modal", "idle", pause_after_s=IDLE_S / 2, checkpoint_after_s=0, stop_after_s=IDLE_S,
                      idle_timeout_s=120, memory_snapshots=False)
    secrets = [modal_emulator.token_id, modal_emulator.token_secret, modal_emulator.url]
    k = Kernel(name)
    try:
        info = lifecycle_start(k, "modal", secrets)
        assert info["unenforced"] == ["pids_max", "scratch_mib"]
        # Modal keeps no memory without snapshots: the pause level is skipped, idle stops
        assert info["idle"]["plan"] == [["stop", IDLE_S]]
        assert len(modal_emulator.running()) == 1

        # C10: stopped while idle; the next cell says so plainly and runs in a fresh interpreter
        k.wait_state("stopped")
        assert wait_gone(lambda: not modal_emulator.running())
        r = k.execute("x")
        assert re.match(r"sandbox-kernel: sandbox stopped after \d+ s idle; state was lost; this is a fresh "
                        "interpreter\n", r.stderr), r.stderr
        assert r.ename == "NameError", error_text(r)
        assert [o["content"]["ename"] for o in r.of_type("error")] == ["NameError"]
        r = k.execute("y = 2; y * 21")
        assert r.result_text == "42" and not r.stderr, error_text(r)
        info = k.sandbox_info()
        assert info["state"] == "running" and info["idle"]["counts"] == {"stop": 1}
        assert len(modal_emulator.running()) == 1
    finally:
        k.shutdown()
    assert wait_gone(lambda: not modal_emulator.running()), modal_emulator.running()
    assert modal_emulator.unimplemented == []


def test_modal_cases_c04_to_c08(modal_emulator, cloud_spec):
    k = Kernel(cloud_spec("modal", "plain"))
    try:
        run_cases_c04_to_c08(k)
    finally:
        k.shutdown()
    assert wait_gone(lambda: not modal_emulator.running()), modal_emulator.running()


# ---------------------------------------------------------------------------
# doctor
# ---------------------------------------------------------------------------


def test_doctor_asks_every_backend(e2b_emulator, monkeypatch):
    """doctor names no backend: what each is, enforces and lacks comes through the contract."""
    from sandbox_kernel.doctor import backend_report

    report = backend_report()
    e2b, modal = report["e2b"], report["modal"]
    assert e2b["available"] and e2b["problems"] == [] and e2b["display_name"] == "E2B"
    assert e2b["idle"]["pause"] == "freeze, memory kept" and "E2B_API_KEY" in e2b["credentials"]
    # the egress options the providers' own allowlists have no equivalent for (issue 17)
    egress = ["allow_ports", "egress_resolve", "max_egress_connections_per_cell", "max_egress_bytes_per_cell"]
    assert e2b["ignores"] == ["ro_paths", "memory_mib", "cpu_cores", "pids_max", "scratch_mib", *egress]
    assert modal["idle"]["pause"] == "not possible"
    assert modal["ignores"] == ["ro_paths", "pids_max", "scratch_mib", *egress]
    assert report["local"]["ignores"] == ["lifetime_s"] and report["local"]["credentials"] is None
    assert report["local"]["copies"] == {"snapshot": "yes", "restore": "yes", "fork": "yes"}  # as root
    assert e2b["copies"] == {"snapshot": "yes", "restore": "yes", "fork": "yes"}  # tests/backends/test_e2b_copies.py
    assert "snapshot_filesystem" in modal["copies"]["snapshot"]
    monkeypatch.setenv("E2B_API_KEY", "e2b_wrong")
    problems = backend_report()["e2b"]["problems"]
    assert len(problems) == 1 and "rejected the API key" in problems[0], problems


def test_snapshot_restore_and_fork_are_refused_on_modal_naming_it_and_the_kernel_goes_on(
        modal_emulator, cloud_spec):
    """Issue 30 on Modal: ``kernel_info`` and each of ``snapshot_request``,
    ``restore_request`` and ``fork_request`` say the backend cannot, and why (its SDK's own
    calls named); the refusal touches nothing: same interpreter, same variables.  (E2B does
    them: tests/backends/test_e2b_copies.py.)"""
    backend, shown, sdk = "modal", "Modal", "snapshot_filesystem"
    k = Kernel(cloud_spec(backend, "copies"))
    try:
        assert k.execute("import os\nz, pid = 7, os.getpid()").status == "ok"
        snaps = k.sandbox_info()["snapshots"]
        assert not (snaps["snapshot"] or snaps["restore"] or snaps["fork"]), snaps
        assert shown in snaps["why_not"] and sdk in snaps["why_not"] and shown in snaps["fork_why_not"]
        for msg_type, content in (("snapshot_request", {}), ("restore_request", {"snapshot_id": "s1"}),
                                  ("fork_request", {"n": 1})):
            r = control(k, msg_type, content)
            assert r["status"] == "error" and r["ename"] == "SnapshotUnsupported", r
            assert shown in r["evalue"] and sdk in r["evalue"], r
        assert k.execute("print(z, os.getpid() == pid)").stdout == "7 True\n"  # untouched
    finally:
        k.shutdown()


@pytest.mark.parametrize("backend", ["e2b", "modal"])
def test_the_agents_channel_is_out_of_reach_in_the_emulations(backend, request, cloud_spec):
    """The channel probes of ``tests/security/test_agent_channel.py`` through a cloud
    backend. The emulations run each command in bubblewrap (the agent is PID 1 and
    non-dumpable there), so this checks the backend's agent start and the relay's
    strictness end to end, not the provider's own process model (see docs/security.md)."""
    from security.test_agent_channel import POOL_CELL, PROBES

    request.getfixturevalue(f"{backend}_emulator")
    k = Kernel(cloud_spec(backend, "channel"))
    try:
        assert k.execute("state = 41").status == "ok"
        for name, code in PROBES.items():
            r = k.execute(code, timeout=60)
            assert r.status == "ok" and r.stdout.split() == ["refused"], (name, error_text(r))
        r = k.execute(POOL_CELL, interrupt_after=4, timeout=90)
        assert r.ename == "KeyboardInterrupt", error_text(r)
        assert k.execute("state + 1", timeout=60).result_text == "42"
    finally:
        k.shutdown()


# ---------------------------------------------------------------------------
# POSIX facilities (issue 18 item 6): the same table as the local runtimes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["e2b", "modal"])
def test_posix_facilities_in_the_emulations(backend, request, cloud_spec):
    """What a normal Linux process expects, through the cloud backends' own paths (their
    agent start, user switch and environment) into the emulated sandboxes (bubblewrap as
    uid 65534, standing in for E2B's microVM and Modal's container).  CPUs and memory are
    the provider's business there and are not checked."""
    from posix_table import mismatches, probe

    request.getfixturevalue(f"{backend}_emulator")
    k = Kernel(cloud_spec(backend, "posix"))
    try:
        assert mismatches(probe(k)) == {}
    finally:
        k.shutdown()
