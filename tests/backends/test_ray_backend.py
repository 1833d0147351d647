"""The Ray backend against a real two-node Ray cluster started on this machine.

One cluster for the module (:mod:`ray_cluster`): a head and a second node with
custom resources; kernels pinned to the second node by ``sandbox_node``.  Every
cell runs in a gVisor sandbox that the Ray actor on that node made with the
local backend's code, never on the host.  Checked: the backend contract's
lifecycle script; a kernel through ``jupyter_client`` (state, the node it runs
on, interrupt, the memory limit's message, nothing of the proxy's environment or
signing key in the Ray worker); the agent client's quick-start and file flows;
isolation probes from a cell on the second node (its environment, its network,
its limits); the refusals (unreachable address, a sandbox no
node can hold, a full cluster after a bounded wait); a killed proxy's actor and
sandbox reaped; a node stopped under a kernel (the next cell names it, a new
sandbox on another node, Ray's actor table left clean); a checkpoint taken on one
node and restored on another through Ray's object store.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import socket
import threading
import time
import uuid

import pytest

pytest.importorskip("ray")

from client_flow import files_flow, quickstart_flow
from kernels import Kernel
from sandbox_kernel import Sandbox
from sandbox_kernel.backends.local import runsc
from sandbox_kernel.backends.local import snapshots as store
from sandbox_kernel.backends.local.layout import state_base
from sandbox_kernel.client import SnapshotError
from sandbox_kernel.errors import AdmissionRefused, BackendError
from sandbox_kernel.kernelspec import install
from sandbox_kernel.policy import Policy
from sandbox_kernel.sandbox_state import IdleAction, SandboxState

from backends.ray_cluster import WORKER_RESOURCES, LocalRayCluster, actor_records, closed_port, live_actors
from backends.test_contract import cell, lifecycle_script, make_relay

pytestmark = pytest.mark.skipif(not runsc.have_runsc() or os.geteuid() != 0, reason="runsc as root needed")

PIN = {"sandbox_node": "1"}


@pytest.fixture(scope="module")
def ray_cluster():
    c = LocalRayCluster()
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def ray_spec(ray_cluster, kernelspec_prefix):
    """A kernelspec whose sandbox runs on the cluster's second node (512 MiB, 1 core)."""
    name = "sandbox-test-ray"
    install(name, backend="ray", prefix=kernelspec_prefix,
            options={"address": ray_cluster.address, "resources": PIN, "memory_mib": 512, "cpu_cores": 1})
    return name


@pytest.fixture(scope="module")
def third_node(ray_cluster):
    """``(ray start process, node id)`` of a third node with ``sandbox_node`` 1 and a resource
    of its own, ``third_node`` 1, added once for the tests that move a sandbox off it
    (first) and stop it under a kernel (last); stopped at the module's end if still up."""
    proc, node_id = ray_cluster.add_node({"sandbox_node": 1, "third_node": 1})
    yield proc, node_id
    if proc not in ray_cluster.stopped:
        ray_cluster.stop_node(proc)


def backend(ray_cluster, **kw):
    from sandbox_kernel.backends.ray import RayBackend

    policy = kw.pop("policy", Policy(memory_mib=512, cpu_cores=1))
    return RayBackend(policy, uuid.uuid4().hex, address=ray_cluster.address, **kw)


def named_actors() -> set[str]:
    import ray

    return {a["name"] if isinstance(a, dict) else a for a in ray.util.list_named_actors(all_namespaces=True)}


def procs_naming(text: str) -> list[int]:
    """Pids whose argv names ``text`` (a kernel id: the sandbox's runtime and watchdog)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(d))
            except OSError:
                pass
    return found


def wait_until(what: str, ok, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def test_the_contract_lifecycle_script(ray_cluster):
    lifecycle_script(("ray", Policy(memory_mib=512, cpu_cores=1),
                      {"address": ray_cluster.address, "resources": {"sandbox_node": 1}}))


def test_a_kernel_on_the_second_node(ray_cluster, ray_spec):
    probe = "probe-" + uuid.uuid4().hex
    k = Kernel(ray_spec, env={**os.environ, "SANDBOX_KERNEL_LEAK_PROBE": probe})
    try:
        info = k.sandbox_info()
        where = info["ray"]
        assert info["backend"] == "ray" and where["node_id"] == ray_cluster.worker_node_id, info
        assert where["runtime"] == "gvisor" and "gVisor" in info["boundary"]
        assert k.execute("x = 41").status == "ok"
        assert k.execute("x + 1").result_text == "42"  # state persists between cells

        r = k.execute("import time; time.sleep(60)", interrupt_after=0.5, timeout=60)
        assert r.ename == "KeyboardInterrupt"
        assert k.execute("x").result_text == "41"

        # nothing of the proxy's environment or the frontend's key in the Ray worker
        with open(f"/proc/{where['worker_pid']}/environ", "rb") as f:
            environ = f.read()
        with open(f"/proc/{where['worker_pid']}/cmdline", "rb") as f:
            cmdline = f.read()
        key = k.km.session.key
        assert key and key not in environ and key not in cmdline
        assert probe.encode() not in environ and b"SANDBOX_KERNEL_LEAK_PROBE" not in environ

        r = k.execute("l = []\nwhile True: l.append(bytearray(16 * 1024**2))", timeout=180)
        assert r.ename == "SandboxRestarted", r.reply["content"]
        assert "memory limit 512 MiB exceeded" in r.reply["content"]["evalue"]
        assert k.execute("1 + 1").result_text == "2"  # a new sandbox, on the pinned node again
        assert k.sandbox_info()["ray"]["node_id"] == ray_cluster.worker_node_id
    finally:
        k.shutdown()


#: Run in a cell: what the sandbox's processes hold in their environments, which interfaces
#: it has, whether two loopback ports of the machine answer it, and the CPUs and memory it is
#: shown; one JSON line.
ISOLATION_PROBE = r"""
import json, os, socket
def reach(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return "connected"
    except OSError as err:
        return type(err).__name__
environs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        environs.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
    except OSError:
        pass
mem = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/meminfo")}
print(json.dumps({"env": dict(os.environ), "environs": environs, "ifaces": [n for _, n in socket.if_nameindex()],
                  "listener": reach(LISTENER), "gcs": reach(GCS), "cpus": os.cpu_count(), "mem_kib": mem["MemTotal"],
                  "uid": os.getuid()}))
"""


def test_the_agent_client_and_isolation_probes_on_the_second_node(ray_cluster, ray_spec, tmp_path):
    """The client's quick-start and file flows, then isolation probes from a cell, on one
    kernel pinned to the second node whose proxy has a variable planted in its environment."""
    planted = "planted-" + uuid.uuid4().hex
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SANDBOX_TEST_SECRET", planted)
        sbx = Sandbox(ray_spec).start()  # the proxy starts here, with the variable
    try:
        info = sbx.info()
        assert info.backend == "ray" and info.state == "running" and info.egress == "none", info
        assert info.raw["ray"]["node_id"] == ray_cluster.worker_node_id and "gVisor" in info.boundary
        quickstart_flow(sbx)
        files_flow(sbx, tmp_path)
        isolation_probes(ray_cluster, sbx, planted)
    finally:
        sbx.close()


def serve(directory) -> tuple[http.server.ThreadingHTTPServer, list[str]]:
    """A loopback HTTP server of ``directory`` (the only kind of server a test's sandbox
    may reach) and the request lines it got."""
    handler = type("H", (http.server.SimpleHTTPRequestHandler,), {"access": []})
    handler.log_message = lambda self, fmt, *args: type(self).access.append(self.requestline)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(directory)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, handler.access


FETCH = """
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen("http://{host}/{name}", timeout=30).read().decode())
except urllib.error.HTTPError as e:
    print("refused", e.code)
"""


def test_the_egress_allowlist_and_a_copied_workspace_on_the_second_node(ray_cluster, kernelspec_prefix, tmp_path):
    """One kernel on the second node. ``network=allowlist`` enforced by the egress proxy on the
    sandbox's node: an allowed name (resolved to a loopback server of the test's by
    ``egress_resolve``) answers, one not allowed (another loopback server) is refused with the
    local backend's line in its cell, and the attempts are in ``Sandbox.info().egress_detail``.
    ``workspace=rw``: the folder copied in (a file of it read in a cell, in the working
    directory), a file written in a cell copied back to the host folder by ``sync``."""
    from sandbox_kernel.backends.ray import RayBackend

    unenforced = RayBackend.check_policy(Policy(workspace="rw", network="allowlist", allow_domains=("a.test",)))
    assert not {"workspace", "workspace_path", "allow_domains"} & set(unenforced), unenforced
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "hello.txt").write_text("hello from the allowed server\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "secret.txt").write_text("must not be fetched\n")
    allowed, allowed_log = serve(tmp_path / "allowed")
    other, other_log = serve(tmp_path / "other")
    name = "sandbox-test-ray-egress"
    install(name, backend="ray", prefix=kernelspec_prefix, options={
        "address": ray_cluster.address, "resources": PIN, "memory_mib": 512, "cpu_cores": 1,
        "network": "allowlist", "allow_domains": ["data.test"], "workspace": "rw", "workspace_path": str(project),
        "egress_resolve": {"data.test": f"127.0.0.1:{allowed.server_address[1]}",
                           "blocked.test": f"127.0.0.1:{other.server_address[1]}"}})
    sbx = Sandbox(name).start()
    try:
        info = sbx.info()
        assert info.raw["ray"]["node_id"] == ray_cluster.worker_node_id and info.egress == "allowlist", info
        ex = sbx.run(FETCH.format(host="data.test", name="hello.txt"))
        assert ex.ok and "hello from the allowed server" in ex.stdout, ex
        assert any("GET /hello.txt" in line for line in allowed_log), allowed_log
        ex = sbx.run(FETCH.format(host="blocked.test", name="secret.txt"))
        assert ex.ok and "refused 403" in ex.stdout, ex
        assert "egress denied: blocked.test:80 is not in allow_domains" in ex.stderr, ex.stderr
        assert other_log == []
        detail = sbx.info().egress_detail
        assert detail["allow_domains"] == ["data.test"] and "on the sandbox's node" in detail["enforced"], detail
        assert detail["counts"] == {"allowed": 1, "denied": 1}, detail
        ok, denied = detail["recent"]
        assert (ok["host"], ok["verdict"], denied["host"], denied["verdict"]) == (
            "data.test", "allowed", "blocked.test", "denied"), detail
        assert ok["cell"] and denied["cell"] and ok["cell"] != denied["cell"], detail  # each its own cell
        assert "not in allow_domains" in denied["reason"], denied

        ex = sbx.run("import os; print(os.getcwd()); print(open('data.csv').read(), end='')")
        assert ex.ok and ex.stdout == "/home/sandbox/work\na,b\n1,2\n", ex
        ex = sbx.run("open('result.txt', 'w').write('written on the node\\n')")
        assert ex.ok and not (project / "result.txt").exists(), ex
        report = sbx.sync()
        assert {"path": "result.txt", "action": "created", "detail": ""} in report["files"], report
        assert (project / "result.txt").read_text() == "written on the node\n"
        assert (project / "data.csv").read_text() == "a,b\n1,2\n"

        # a kernel with egress is not snapshotted, rewound or forked: the reply says why, it goes on
        assert info.raw["snapshots"]["snapshot"] is False and info.raw["snapshots"]["fork"] is False
        for op in (sbx.snapshot, lambda: sbx.fork(1)):
            with pytest.raises(SnapshotError) as err:
                op()
            assert err.value.ename == "SnapshotUnsupported" and "network egress" in err.value.evalue, err.value
            assert "egress proxy" in err.value.evalue and "Ray backend" in err.value.evalue
        assert sbx.run("print(1 + 1)").stdout == "2\n"
    finally:
        sbx.close()
        allowed.shutdown()
        other.shutdown()


def isolation_probes(ray_cluster, sbx, planted: str) -> None:
    """:data:`ISOLATION_PROBE` in a cell of ``sbx``, with a listener of the test's on the
    machine's loopback; what it found, checked."""
    listener = socket.create_server(("127.0.0.1", 0))  # the machine's loopback, where the node runs
    accepted: list = []
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        code = ISOLATION_PROBE.replace("LISTENER", str(listener.getsockname()[1])).replace("GCS", str(ray_cluster.port))
        ex = sbx.run(code, timeout=60)
    finally:
        stop.set()
        t.join()
        listener.close()
    assert ex.error is None, ex.error
    out = json.loads(ex.stdout.strip().splitlines()[-1])
    # nothing of the proxy's environment, the Ray worker's or the frontend's key
    seen = json.dumps([out["env"], out["environs"]])
    key = sbx.aio.transport.kc.session.key.decode()
    assert key and planted not in seen and "SANDBOX_TEST_SECRET" not in seen and key not in seen
    assert not [k for k in out["env"] if k.startswith("RAY_")] and "RAY_" not in seen, out["env"]
    assert ray_cluster.address not in seen and ray_cluster.temp_dir not in seen
    # no network: only its own loopback, so neither the machine's listener nor the cluster answers
    assert out["ifaces"] == ["lo"], out["ifaces"]
    assert out["listener"] == out["gcs"] == "ConnectionRefusedError" and not accepted, out
    # its limits: 1 core, 512 MiB, not root
    assert out["cpus"] == 1 and 0 < out["mem_kib"] <= 512 * 1024, out
    assert out["uid"] != 0


def test_an_unreachable_cluster_is_named():
    from sandbox_kernel.backends.ray import RayBackend

    address = f"127.0.0.1:{closed_port()}"
    b = RayBackend(Policy(), uuid.uuid4().hex, address=address, connect_timeout_s=2)
    with pytest.raises(BackendError, match=f"Ray cluster at {address} .*is unreachable"):
        asyncio.run(b.start())


def test_a_sandbox_no_node_can_hold_is_refused_with_the_numbers(ray_cluster):
    b = backend(ray_cluster, policy=Policy(memory_mib=4 << 20, cpu_cores=1))  # 4 TiB
    with pytest.raises(AdmissionRefused) as err:
        asyncio.run(b.start())
    assert err.value.details["resource"] == "memory" and err.value.details["need"] == 4 << 20
    assert "needs memory 4194304 MiB" in str(err.value) and f":{ray_cluster.port} " in str(err.value)

    b = backend(ray_cluster, resources={"gpu_box": 1})
    with pytest.raises(AdmissionRefused, match="the most gpu_box any node has is 0 units"):
        asyncio.run(b.start())


def test_a_full_cluster_refuses_after_a_bounded_wait(ray_cluster):
    async def main():
        first = backend(ray_cluster, resources={"single_slot": 1})
        second = backend(ray_cluster, resources={"single_slot": 1}, placement_timeout_s=2)
        await first.start()  # holds the cluster's only single_slot
        try:
            with pytest.raises(AdmissionRefused) as err:
                await second.start()
            d = err.value.details
            assert (d["resource"], d["need"], d["available"]) == ("single_slot", 1, 0)
            assert "did not place this sandbox within" in str(err.value)
            assert f"{first.kernel_id}" not in str(err.value)
        finally:
            await first.kill()
        assert f"sandbox-kernel-{second.kernel_id}" not in named_actors()

    asyncio.run(main())


def test_a_killed_proxy_leaves_no_actor_or_sandbox(ray_cluster, ray_spec):
    k = Kernel(ray_spec)
    try:
        assert k.execute("y = 1").status == "ok"
        where = k.sandbox_info()["ray"]
        actor, kid = where["actor"], where["container_id"]
        assert actor in named_actors() and procs_naming(kid)
        k.km.provisioner.process.send_signal(signal.SIGKILL)  # the proxy dies: no cleanup of its own
        wait_until("the actor ended", lambda: actor not in named_actors())
        state_dir = state_base() / kid  # the nodes run here, with this process's state base
        wait_until("the sandbox reaped", lambda: not procs_naming(kid) and not state_dir.exists())
    finally:
        k.shutdown()


#: What each copy draws: its namespace, the user's seeded generator, and entropy.
COPY_PROBE = "print(json.dumps([x, rng.random(), random.random(), str(uuid.uuid4())]))"


def _drawn(sbx) -> list:
    ex = sbx.run(COPY_PROBE)
    assert ex.ok, ex
    return json.loads(ex.stdout)


def test_snapshot_rewind_and_fork_through_the_client(ray_cluster, ray_spec):
    """``Sandbox.snapshot/restore/fork`` of a kernel on the second node: the image kept on
    this machine's disk (the local snapshot folders), a rewind restored in a new actor, two
    forks each restored by its own proxy on a node Ray picks, with the source's namespace,
    their own entropy and the user's seeded generator going on identically; closed, no actor."""
    assert not live_actors(), "a sandbox of an earlier test holds the second node's resources"
    with Sandbox(ray_spec) as source:
        raw = source.info().raw
        assert raw["snapshots"] == {"snapshot": True, "restore": True, "supported": True, "fork": True}, raw
        kid = raw["ray"]["actor"].removeprefix("sandbox-kernel-")
        assert source.run("import json, random, uuid\nx = {'a': 1}\nrng = random.Random(42); rng.random()").ok
        snap = source.snapshot()
        assert snap.size_mib > 1 and (store.kernel_dir(kid) / snap.id / "image").is_dir()
        first = raw["ray"]["container_id"]
        assert source.run("x.clear(); del rng").ok  # the destructive cell
        assert source.restore(snap) == snap
        assert source.run("print(json.dumps(x))").stdout == '{"a": 1}\n'
        rewound = source.info().raw["ray"]
        assert rewound["container_id"] != first and rewound["actor"] == raw["ray"]["actor"], rewound

        with pytest.raises(SnapshotError) as err:  # 9 sandboxes of 1 core and 1 sandbox_node: more than all nodes have
            source.fork(8)
        assert err.value.ename == "ForkRefused" and " 9 of the Ray cluster, whose live nodes have " in err.value.evalue
        assert "ask for fewer" in err.value.evalue and not list(store.kernel_dir(kid).glob("fork-*")), err.value
        forks = source.fork(2)
        try:
            infos = [f.info().raw for f in forks]
            assert len({i["ray"]["container_id"] for i in infos} | {rewound["container_id"]}) == 3, infos
            assert {i["fork_of"]["source_kernel"] for i in infos} == {kid}, infos
            assert not list(store.kernel_dir(kid).glob("fork-*"))  # every hand-off taken and removed
            seen = [_drawn(s) for s in (source, *forks)]
            assert all(v[0] == {"a": 1} for v in seen), seen  # the namespace, in each copy
            assert seen[0][1] == seen[1][1] == seen[2][1]  # the user's Random(42) continues identically
            for col in (2, 3):  # random and uuid4: each copy its own entropy
                assert len({v[col] for v in seen}) == 3, [v[col] for v in seen]
        finally:
            for f in forks:
                f.close()
    assert not store.kernel_dir(kid).exists()  # the source's snapshots removed at its shutdown
    wait_until("no actor of a sandbox left", lambda: not live_actors())


def test_a_checkpoint_moves_to_another_node_through_the_object_store(ray_cluster, third_node):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    assert not live_actors(), "a sandbox of an earlier test holds the second node's resources"
    _, third = third_node
    holds = [placement_group([{"sandbox_node": WORKER_RESOURCES["sandbox_node"]}])]  # the second node's, all
    ray.get(holds[0].ready(), timeout=60)

    async def main():
        relay, host = make_relay(("ray", Policy(memory_mib=512, cpu_cores=1),
                                  {"address": ray_cluster.address, "resources": {"sandbox_node": 1}}))
        try:
            await asyncio.wait_for(relay.start(), 120)
            taken = relay.describe()["ray"]
            assert taken["node_id"] == third, taken  # the only node with room
            remove_placement_group(holds.pop())
            content, text = await cell(relay, host, "import random\nx = 41\nr = random.Random(7); r.random()\n"
                                                    "open('/tmp/kept.txt', 'w').write('kept'); x")
            assert text == "41", content

            assert await relay.suspend(IdleAction.CHECKPOINT, idle_s=1, min_idle_s=0)
            assert relay.state is SandboxState.CHECKPOINTED
            image = relay.describe()["ray"]["checkpoint"]
            assert image["node_id"] == third and image["image_bytes"] > 1 << 20, image
            # the actor ended and its node kept nothing: the image is only in Ray's object store
            assert not live_actors()
            assert not (state_base() / taken["container_id"]).exists() and not procs_naming(taken["container_id"])

            holds.append(placement_group([{"sandbox_node": 1, "third_node": 1}]))  # the third node's slot
            await asyncio.to_thread(ray.get, holds[0].ready(), timeout=60)
            content, text = await cell(relay, host, "x + 1, open('/tmp/kept.txt').read(), r.random()")
            assert content["status"] == "ok" and text == f"(42, 'kept', {_second_draw()!r})", (content, text)
            restored = relay.describe()["ray"]
            assert restored["node_id"] == ray_cluster.worker_node_id and "checkpoint" not in restored, restored
            assert relay.counts["restore"] == 1
            told = [d for e, d in host.events if e == "restored"]
            assert told and f"moved from Ray node {third[:12]} to {ray_cluster.worker_node_id[:12]}" in told[-1], told
            assert "through Ray's object store" in told[-1]
        finally:
            await relay.shutdown()

    try:
        asyncio.run(asyncio.wait_for(main(), 300))
    finally:
        for pg in holds:
            remove_placement_group(pg)
    wait_until("no actor of a sandbox left", lambda: not live_actors())


def _second_draw() -> float:
    """What ``random.Random(7)`` draws second: a user's seeded generator goes on across a restore."""
    import random

    r = random.Random(7)
    r.random()
    return r.random()


def test_a_stopped_node_is_named_and_a_new_sandbox_starts_on_another(ray_cluster, ray_spec, third_node):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    assert not live_actors(), "a sandbox of an earlier test holds the second node's resources"
    proc, doomed = third_node
    # the second node's sandbox_node all held, so the kernel's sandbox can only land on the added node
    held = placement_group([{"sandbox_node": WORKER_RESOURCES["sandbox_node"]}])
    ray.get(held.ready(), timeout=60)
    k = Kernel(ray_spec)
    try:
        where = k.wait_state("running")["ray"]
        remove_placement_group(held)
        held = None
        assert where["node_id"] == doomed, where
        assert k.execute("x = 1").status == "ok"
        ray_cluster.stop_node(proc)  # SIGTERM to its `ray start --block`: the node leaves, with its workers

        # the proxy learns it from Ray (the actor's death, the node table) and starts a new
        # sandbox at once, which Ray can only place on the second node
        wait_until("a new sandbox on the second node", lambda: (lambda i: i["state"] == "running" and i["ray"].get(
            "node_id") == ray_cluster.worker_node_id)(k.sandbox_info()), 120)
        r = k.execute("x")
        assert r.ename == "NameError", r.reply["content"]  # a fresh interpreter
        told = r.stderr
        assert f"the Ray node {doomed[:12]} (" in told and "was stopped (received SIGTERM)" in told, told
        assert "state was lost" in told and "fresh interpreter" in told, told
        assert k.execute("1 + 1").result_text == "2" and "Ray node" not in k.execute("2").stderr  # told once

        # Ray's actor table: the first actor dead with its node, the new one alive on the second node
        first, *rest = actor_records(where["actor"])
        assert first["State"] == "DEAD" and "its node has died" in str(first["DeathCause"]), first
        assert [a["State"] for a in rest] == ["ALIVE"], rest
        # the lost node's sandbox reaped by its watchdog when the node's worker ended
        state_dir = state_base() / where["container_id"]
        wait_until("the lost node's sandbox reaped",
                   lambda: not procs_naming(where["container_id"]) and not state_dir.exists())
    finally:
        k.shutdown()
        if held is not None:
            remove_placement_group(held)
    wait_until("no actor of a sandbox left", lambda: not live_actors())
