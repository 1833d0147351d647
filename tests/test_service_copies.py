"""Issue 30 through the sandbox service: snapshot, rewind and fork of an ordinary user's kernel.

Root runs ``sandbox-kernel service`` (a subprocess of the test, its own socket and state,
as in ``test_service.py``); a created ordinary user drives its kernel through the agent
client ``Sandbox`` (``copies_user.py`` below, run as that user): a snapshot, a destructive
cell, a rewind; ``fork(2)`` with each copy's variables and entropy; then, while it holds a
snapshot and a fork's hand-off not yet taken, a second created user asks the service to
restore from them, fork from them and remove them (each refused, naming why), and the
first user's kernel goes on, rewinds and starts its fork.  After its shutdown nothing is
left: no image in the service's state, no sandbox.  The service's bounds, with the service
started again with small ones (:func:`bounded`): images a user past ``--max-images-per-uid``
(two of its kernels asking at the same moment included), and forks past its admission
(``--memory-headroom-mib``), each refused naming them, the kernel going on.  Real
components throughout: runsc as root, the users' processes as the users.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from nonroot_env import (
    SERVICE_ASK,
    USERS,
    as_user,
    make_env,
    running_service,
    service_log,
    service_socket,
    start_service,
    until_ready_as_a,
)
from sandbox_kernel.backends.local.admission import host_memory_mib

KERNEL = "sk-service-copies"
FLAGS = ["--prestart", "0", "--memory-mib", "512", "--pids-max", "64", "--pause-after-s", "600",
         "--checkpoint-after-s", "0", "--pool-socket", "", "--service-socket", str(service_socket())]

#: Run as user a: its kernel through the service, every step's result printed as JSON at the end.
USER_A = r'''
import json, os, sys, time
from sandbox_kernel import Sandbox
from sandbox_kernel.client import SnapshotError

name, hold = sys.argv[1], sys.argv[2]
SETUP = ("import json, random, uuid\nx = {'a': 1}\nopen('f.txt', 'w').write('kept')\n"
         "rng = random.Random(42); rng.random()")
PROBE = "print(json.dumps([x, open('f.txt').read(), rng.random(), random.random(), str(uuid.uuid4())]))"
out = {}
with Sandbox(name) as src:
    info = src.info().raw
    out["boundary"], out["copies"] = info.get("boundary"), info.get("snapshots")
    assert src.run(SETUP).error is None
    snap = src.snapshot()
    out["snapshot"] = snap.id
    src.run("x['a'] = 'gone'; os_ = __import__('os'); os_.remove('f.txt'); del rng")
    out["destroyed"] = src.run("print(x, os_.path.exists('f.txt'), 'rng' in globals())").stdout
    src.restore(snap)
    out["rewound"] = json.loads(src.run(PROBE).stdout)
    forks = src.fork(2)
    try:
        out["fork_of"] = [f.info().raw.get("fork_of") for f in forks]
        out["probes"] = [json.loads(s.run(PROBE).stdout) for s in (src, *forks)]
    finally:
        for f in forks:
            f.close()
    args = src._loop.call(src.aio.fork_arguments(1, 120))  # a hand-off held, not yet taken
    out["fork_from"] = args[0][0]
    with open(hold + ".ready.part", "w") as f:  # renamed into place: the test never reads it half written
        json.dump({"snapshot": snap.id, "handoff": args[0][0].split("=", 1)[1].split(":", 1)[1],
                   "container_id": src.info().raw["container_id"]}, f)
    os.replace(hold + ".ready.part", hold + ".ready")
    while not os.path.exists(hold):
        time.sleep(0.2)
    out["untouched"] = src.run("print(x)").stdout
    src.run("x['a'] = 2")
    src.restore(snap)
    out["rewound_again"] = src.run("print(x)").stdout
    late = Sandbox._of(src.aio.forked(args[0]))
    late._loop.call(late.aio.start_as_fork())
    try:
        out["late_fork"] = late.run("print(x)").stdout
    finally:
        late.close()
print(json.dumps(out))
'''

#: Run as user b: the service asked directly for a's snapshot and hand-off.
USER_B = r'''
import json, os, socket, sys
sock_path, python, snapshot, handoff, cid = sys.argv[1:6]
''' + SERVICE_ASK + r'''
out = {}
for what, source in (("restore", snapshot), ("fork", handoff)):
    out[what] = ask({"op": "create", "kernel_id": "b-kernel", "python": python, "policy": {"memory_mib": 512},
                     "from": source})
out["remove"] = ask({"op": "remove_snapshots", "kernel_id": "b-kernel", "snapshot_ids": [snapshot, handoff]})
out["remove_all"] = ask({"op": "remove_snapshots", "kernel_id": "b-kernel", "snapshot_ids": None})
out["snapshot_a"] = ask({"op": "snapshot", "container_id": cid, "snapshot_id": "b0123"})
out["fork_a"] = ask({"op": "fork", "container_id": cid, "fork_id": "b0123", "n": 1, "meta": {}})
out["escape"] = ask({"op": "create", "kernel_id": "b", "python": python, "policy": {}, "from": "../../etc"})
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from make_env(tmp_path_factory, {KERNEL: FLAGS})


@pytest.fixture(scope="module")
def service(env):
    yield from running_service(env)


def _started_as_a(env, service, script: str, hold: Path) -> tuple[subprocess.Popen, str]:
    """Run ``script`` (its source) as user a with the kernel's name and ``hold``, until it writes
    ``hold + ".ready"``; the process and what it wrote."""
    path = env["base"] / f"{hold.name}.py"
    path.write_text(script)
    return until_ready_as_a(env, service, [str(path), KERNEL, str(hold)], hold, wait_s=400)


def _images(service) -> list[str]:
    base = service["state"] / "service-snapshots"
    return sorted(str(p.relative_to(base)) for p in base.glob("*/*")) if base.is_dir() else []


def _sandboxes(service) -> list[str]:
    return [d.name for d in service["state"].iterdir() if d.name.startswith("sandbox-kernel-")]


def test_an_ordinary_users_kernel_snapshots_rewinds_and_forks_through_the_service_its_own_alone(env, service):
    a, b = USERS
    ua, ha = env["users"][a]
    (env["base"] / "copies_other.py").write_text(USER_B)
    hold = ha / "hold-copies"
    runner, ready = _started_as_a(env, service, USER_A, hold)
    try:
        held = json.loads(ready)
        # the images are root's, in the service's state, under a's uid; a's own paths hold none
        images = _images(service)
        assert any(i.startswith(f"{ua.pw_uid}-") and i.endswith("/" + held["snapshot"]) for i in images), images
        assert any(i.endswith("/" + held["handoff"]) for i in images), images
        assert (service["state"] / "service-snapshots").stat().st_mode & 0o777 == 0o700
        assert not (ha / ".cache" / "sandbox-kernel" / "snapshots").exists()  # none in a's own snapshots

        p = as_user(env, b, [env["python"], str(env["base"] / "copies_other.py"), str(service_socket()),
                             env["python"], held["snapshot"], held["handoff"], held["container_id"]])
        assert p.returncode == 0 and "GOT FDS" not in p.stdout, p.stdout + p.stderr
        other = json.loads(p.stdout.strip().splitlines()[-1])
        for what, name in (("restore", held["snapshot"]), ("fork", held["handoff"]), ("remove", held["snapshot"])):
            assert not other[what]["ok"], (what, other[what])
            assert f"snapshot {name} belongs to another user" in other[what]["reason"], (what, other[what])
        for what in ("snapshot_a", "fork_a"):  # nor snapshot or fork a's running sandbox
            assert other[what] == {"ok": False, "reason": f"sandbox {held['container_id']} belongs to another user",
                                   "refused": True}
        assert other["remove_all"]["ok"]  # b's own (none): a's are not b's to name
        assert not other["escape"]["ok"] and "bad snapshot id" in other["escape"]["reason"], other["escape"]
        assert _images(service) == images  # nothing of a's removed or used
        assert len(_sandboxes(service)) == 1, _sandboxes(service)  # a's kernel's alone: b got no sandbox

        hold.touch()
        stdout, err = runner.communicate(timeout=400)
        assert runner.returncode == 0, err[-3000:] + service_log(service)
        out = json.loads(stdout.strip().splitlines()[-1])
    finally:
        hold.touch()
        if runner.poll() is None:
            runner.kill()
            runner.communicate()

    assert "via the sandbox service" in out["boundary"] and "rootless" not in out["boundary"], out["boundary"]
    assert out["copies"]["supported"] is True and out["copies"]["fork"] is True, out["copies"]
    assert out["destroyed"] == "{'a': 'gone'} False False\n", out["destroyed"]
    rewound = out["rewound"]
    assert rewound[:2] == [{"a": 1}, "kept"], rewound  # the state back, the file too
    probes = out["probes"]
    for v in probes:  # the source's namespace and file in each copy
        assert v[:2] == [{"a": 1}, "kept"], v
    assert probes[0][2] == probes[1][2] == probes[2][2]  # Random(42) seeded before: the same next value
    for col in (3, 4):  # random.random(), uuid4: each copy its own
        assert len({v[col] for v in probes}) == 3, [v[col] for v in probes]
    assert out["fork_of"][0]["fork_id"] == out["fork_of"][1]["fork_id"], out["fork_of"]
    assert out["fork_from"].startswith("--LocalBackend.fork_from=service:fork-"), out["fork_from"]
    assert "/" not in out["fork_from"]  # a name, no path of root's
    assert out["untouched"] == "{'a': 1}\n"  # a's kernel went on after b's attempts
    assert out["rewound_again"] == "{'a': 1}\n" and out["late_fork"] == "{'a': 1}\n", out

    # a's kernels were shut down (their shutdown asked the service): no image kept, no sandbox
    assert _images(service) == [] and _sandboxes(service) == [], service_log(service)


def test_the_service_removes_a_dead_proxys_images_and_stops_leaving_nothing(env, service):
    """A proxy killed (no shutdown): its sandbox is reaped by the watchdog and its images by
    the service's sweep; the service stopped leaves no image and no sandbox."""
    hold = env["users"][USERS[0]][1] / "hold-dead"
    script = ("import os, sys, time\nfrom sandbox_kernel import Sandbox\nsrc = Sandbox(sys.argv[1]).start()\n"
              "src.run('x = 1'); s = src.snapshot()\nwith open(sys.argv[2] + '.ready.part', 'w') as f:\n    f.write(s.id)\n"
              "os.replace(sys.argv[2] + '.ready.part', sys.argv[2] + '.ready')\n"
              "time.sleep(600)\n")
    runner, sid = _started_as_a(env, service, script, hold)
    try:
        assert any(i.endswith("/" + sid) for i in _images(service)), _images(service)
        [cid] = _sandboxes(service)
        proxy = json.loads((service["state"] / cid / "tag.json").read_text())["proxy_pid"]
        os.kill(proxy, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while _images(service) or _sandboxes(service):
            assert time.monotonic() < deadline, (_images(service), _sandboxes(service), service_log(service))
            time.sleep(0.5)
    finally:
        runner.kill()
        runner.communicate()
    proc = service["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, service_log(service)
    assert _images(service) == [] and _sandboxes(service) == []
    assert not (service["state"] / "service-snapshots").exists()


def test_gc_as_root_knows_the_services_images_of_ended_kernels(tmp_path, monkeypatch):
    """``sandbox-kernel gc`` as root counts (``--dry-run``) and removes the images the service keeps
    for kernels whose proxy is gone; a live proxy's stay."""
    from sandbox_kernel.backends.local.service import copies

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    base = tmp_path / "service-snapshots"
    for key, pid in (("1000-ended", int(gone.stdout)), ("1000-live", os.getpid())):
        (base / key / "0123abcd" / "image").mkdir(parents=True)
        (base / key / "owner").write_text(json.dumps({"proxy_pid": pid, "owner_uid": 1000}))
    env = {**os.environ, "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
           "SANDBOX_KERNEL_TEMPLATE_DIR": str(tmp_path / "templates")}
    p = subprocess.run([sys.executable, "-m", "sandbox_kernel", "gc", "--dry-run"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "would remove the sandbox service's snapshots of 1 ended kernel(s)" in p.stdout, \
        p.stdout + p.stderr
    assert (base / "1000-ended").is_dir()
    monkeypatch.setenv("SANDBOX_KERNEL_TEMPLATE_DIR", str(tmp_path / "templates"))
    assert copies.collect() == 1
    assert sorted(d.name for d in base.iterdir()) == ["1000-live"]


#: The bounds of :func:`bounded`'s service: images one user may have it keep, and the memory its
#: sandboxes may hold in all (MiB): one kernel of 512 MiB and two more of the same.
BOUND, ROOM_MIB = 2, 1536

#: Run as user a: a refusal of the call's, as ``[ename, evalue]`` (None: it went through).
REFUSED = r"""
import json, os, sys, time
from sandbox_kernel import Sandbox
from sandbox_kernel.client import SnapshotError

name, hold = sys.argv[1], sys.argv[2]
def refused(call):
    try:
        made = call()
    except SnapshotError as err:
        return [err.ename, err.evalue]
    for fork in made if isinstance(made, list) else ():  # went through: the forks end here
        fork.close()
def held(what):  # the test looks at the service's state, then lets go
    with open(hold + ".ready.part", "w") as f:  # renamed into place: the test never reads it half written
        json.dump(what, f)
    os.replace(hold + ".ready.part", hold + ".ready")
    while not os.path.exists(hold):
        time.sleep(0.2)
out = {}
"""

#: User a's kernel: a snapshot, two forks (admitted, but their hand-offs would pass the bound), a
#: second snapshot (the bound reached), a third, one fork.
USER_BOUND = REFUSED + r"""
with Sandbox(name) as src:
    assert src.run("x = {'a': 1}; open('f.txt', 'w').write('kept')").error is None
    kept = [src.snapshot().id]
    out["forks"] = refused(lambda: src.fork(2))
    src.run("x['b'] = 2")
    kept.append(src.snapshot().id)
    src.run("x['c'] = 3")
    out["third"] = refused(src.snapshot)
    out["fork"] = refused(lambda: src.fork(1))
    out["after"] = src.run("x['d'] = 4; print(x, open('f.txt').read())").stdout
    out["kept"] = [s.id for s in src.snapshots()]
    held(kept)
    src.restore(kept[0])
    out["rewound"] = src.run("print(x, open('f.txt').read())").stdout
print(json.dumps(out))
"""

#: User a's kernel asks for three forks where the service's sandboxes have room for two more.
USER_ADMISSION = REFUSED + r"""
with Sandbox(name) as src:
    assert src.run("x = {'a': 1}; open('f.txt', 'w').write('kept')").error is None
    out["fork"] = refused(lambda: src.fork(3))
    held(None)
    out["after"] = src.run("x['b'] = 2; print(x, open('f.txt').read())").stdout
    out["kept"] = [s.id for s in src.snapshots()]
print(json.dumps(out))
"""


@pytest.fixture
def bounded(env, service):
    """The module's service started again with small bounds: ``--max-images-per-uid`` :data:`BOUND`,
    and ``--memory-headroom-mib`` leaving its sandboxes :data:`ROOM_MIB` of this host's memory; the
    default service again after.  ``host_mib``: the host memory admission counts."""
    def restart(*flags: str) -> None:
        if service["proc"].poll() is None:
            service["proc"].send_signal(signal.SIGTERM)
            assert service["proc"].wait(60) == 0, service_log(service)
        service["proc"] = start_service(env, *flags)

    host = host_memory_mib()
    restart("--max-images-per-uid", str(BOUND), "--memory-headroom-mib", str(host - ROOM_MIB))
    yield {**service, "host_mib": host}
    restart()


def _as_a_until_held(env, service, script: str, name: str) -> tuple[subprocess.Popen, Any, Any]:
    """Run ``script`` as user a until it holds; the process, what it wrote, and its hold file."""
    hold = env["users"][USERS[0]][1] / name
    runner, ready = _started_as_a(env, service, script, hold)
    return runner, json.loads(ready), hold


def _finished(runner: subprocess.Popen, hold: Path, service) -> dict:
    hold.touch()
    try:
        stdout, err = runner.communicate(timeout=400)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 0, err[-3000:] + service_log(service)
    return json.loads(stdout.strip().splitlines()[-1])


def test_the_service_keeps_at_most_its_bound_of_images_for_a_user_and_the_kernel_goes_on(env, bounded):
    """One snapshot past ``--max-images-per-uid`` is refused naming the bound, and so is a fork
    whose hand-offs would pass it (admission would hold them): nothing written, the kernel's
    state and its two snapshots intact, a cell runs, a rewind works."""
    runner, kept, hold = _as_a_until_held(env, bounded, USER_BOUND, "hold-bound")
    try:
        uid = env["users"][USERS[0]][0].pw_uid
        images = [i for i in _images(bounded) if not i.endswith("/owner")]  # each kernel's record beside them
        assert sorted(i.split("/")[1] for i in images) == sorted(kept), images  # the two, no third, no hand-off
        assert all(i.startswith(f"{uid}-") for i in images), images
        assert len(_sandboxes(bounded)) == 1, _sandboxes(bounded)  # no fork started
    finally:
        out = _finished(runner, hold, bounded)
    for what, has, asks in (("forks", 1, 2), ("third", 2, 1), ("fork", 2, 1)):
        assert out[what] is not None, out  # refused, and said so: not a failure of runsc
        assert out[what][0] == ("SnapshotRefused" if what == "third" else "ForkRefused"), out[what]
        assert (f"uid {uid} has {has} snapshots and fork hand-offs kept by the sandbox service and asks for "
                f"{asks} more, past its bound of {BOUND} (sandbox-kernel service --max-images-per-uid)") \
            in out[what][1], out[what]
    assert out["after"] == "{'a': 1, 'b': 2, 'c': 3, 'd': 4} kept\n", out  # the running kernel untouched
    assert out["kept"] == kept, out
    assert out["rewound"] == "{'a': 1} kept\n", out
    assert _images(bounded) == [] and _sandboxes(bounded) == [], service_log(bounded)


def test_a_fork_the_services_admission_cannot_hold_is_refused_with_its_figures_and_the_source_goes_on(
        env, bounded):
    """``fork(3)`` of a 512 MiB kernel where the service's sandboxes have :data:`ROOM_MIB` in all
    (its ``--memory-headroom-mib``): refused by the service's admission before any image, the
    message naming memory and the figures and the service's option; the kernel goes on."""
    runner, _, hold = _as_a_until_held(env, bounded, USER_ADMISSION, "hold-admission")
    try:
        assert _images(bounded) == [], _images(bounded)  # no image, no hand-off
        assert len(_sandboxes(bounded)) == 1, _sandboxes(bounded)  # the source's alone
    finally:
        out = _finished(runner, hold, bounded)
    host = bounded["host_mib"]
    ename, evalue = out["fork"]
    assert ename == "ForkRefused", out["fork"]
    for said in ("3 fork(s) of 512 MiB each refused by admission: not enough memory on this machine for a "
                 "sandbox of 1536 MiB: 512 MiB are committed to 1 running or frozen sandboxes, of "
                 f"{ROOM_MIB} MiB sandboxes may hold (host {host} MiB - {host - ROOM_MIB} MiB headroom, "
                 "x1 overcommit)",
                 "sandbox-kernel service --memory-headroom-mib / sandbox-kernel service --memory-overcommit"):
        assert said in evalue, evalue
    assert out["after"] == "{'a': 1, 'b': 2} kept\n", out
    assert out["kept"] == [], out
    assert _images(bounded) == [] and _sandboxes(bounded) == [], service_log(bounded)


#: User a's two kernels, one snapshot held between them: both ask for one more at the same
#: moment, where the bound has room for one.
USER_RACE = REFUSED + r"""
import threading
with Sandbox(name) as one, Sandbox(name) as two:
    for i, s in enumerate((one, two)):
        assert s.run(f"x = {i}").error is None
    kept = [one.snapshot().id]
    race, together = [None, None], threading.Barrier(2)
    def take(i, s):
        together.wait()
        try:
            race[i] = ["ok", s.snapshot().id]
        except SnapshotError as err:
            race[i] = [err.ename, err.evalue]
    threads = [threading.Thread(target=take, args=(i, s)) for i, s in enumerate((one, two))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["race"] = race
    out["after"] = [s.run("print(x)").stdout for s in (one, two)]
    held(kept + [r[1] for r in race if r[0] == "ok"])
print(json.dumps(out))
"""


def test_two_kernels_of_a_user_asking_at_once_cannot_both_pass_the_bound(env, bounded):
    """One snapshot held of :data:`BOUND`; two kernels of the same user each ask for one more at
    the same moment: one is taken, the other refused naming the bound (the check and the write
    are one step for a user), never both; both kernels go on."""
    runner, kept, hold = _as_a_until_held(env, bounded, USER_RACE, "hold-race")
    try:
        images = [i for i in _images(bounded) if not i.endswith("/owner")]
        assert sorted(i.split("/")[1] for i in images) == sorted(kept), images  # BOUND, not one more
        assert len(kept) == BOUND, kept
    finally:
        out = _finished(runner, hold, bounded)
    uid = env["users"][USERS[0]][0].pw_uid
    outcomes = sorted(r[0] for r in out["race"])
    assert outcomes == ["SnapshotRefused", "ok"], out["race"]
    refusal = next(r[1] for r in out["race"] if r[0] != "ok")
    assert (f"uid {uid} has {BOUND} snapshots and fork hand-offs kept by the sandbox service and asks for 1 "
            f"more, past its bound of {BOUND} (sandbox-kernel service --max-images-per-uid)") in refusal, refusal
    assert out["after"] == ["0\n", "1\n"], out
    assert _images(bounded) == [] and _sandboxes(bounded) == [], service_log(bounded)
