"""A real two-node Ray cluster on this machine, for the Ray backend's tests.

``ray start --head --block`` and ``ray start --block --address=...`` as two child
processes, each the leader of its own session, with a temporary directory and
ports of their own (never Ray's defaults), so another Ray on the machine is
never touched: teardown ends these two processes (``--block`` ends the node's
daemons and workers with them) and then any process left in their two sessions,
by id.  ``ray stop`` is never used (it ends every Ray of the machine).

The nodes inherit this process's environment (``PYTHONPATH``, the worker's
``SANDBOX_KERNEL_STATE_DIR``), as a node's ``ray start`` inherits its host's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
#: The custom resources of the second node: kernels pinned to it ask for them.
WORKER_RESOURCES = {"sandbox_node": 4.0, "single_slot": 1.0}


#: Ports the test's nodes are given are drawn below the kernel's ephemeral range
#: (``net.ipv4.ip_local_port_range``, 32768 and up), so no outgoing connection of the
#: machine's other tests can take one between the check and ``ray start``'s bind.
PORTS = range(20000, 32000)


def free_port() -> int:
    """A loopback port outside the ephemeral range that nothing listens on now."""
    import random

    for port in random.sample(PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    return free_port()


class LocalRayCluster:
    """A head node and a worker node with :data:`WORKER_RESOURCES`; :meth:`start`, :meth:`stop`."""

    def __init__(self) -> None:
        # short: Ray's unix sockets live under it (108-byte limit)
        self.temp_dir = tempfile.mkdtemp(prefix="skray-", dir="/tmp")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        #: Nodes stopped on purpose (:meth:`stop_node`).
        self.stopped: list[subprocess.Popen] = []
        self.head_node_id = ""
        self.worker_node_id = ""

    def _ray_start(self, args: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        with open(Path(self.temp_dir) / log, "wb") as out:
            self.procs.append(subprocess.Popen(
                [RAY, "start", "--block", "--num-cpus=4", "--disable-usage-stats",
                 f"--dashboard-agent-listen-port={free_port()}", *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        return self.procs[-1]

    def _wait(self, what: str, ok, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            for p in self.procs:
                if p.poll() is not None and p not in self.stopped:
                    raise RuntimeError(f"ray start ended ({p.returncode}) waiting for {what}: {self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the test's Ray cluster: no {what} in {timeout_s} s: {self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f.read_text(errors="replace")[-1500:] for f in Path(self.temp_dir).glob("*.log"))

    def _started(self, log: str) -> bool:
        """``ray start`` printed that its node is up (before ``--block`` waits)."""
        try:
            return "Ray runtime started" in (Path(self.temp_dir) / log).read_text(errors="replace")
        except OSError:
            return False

    def _gcs_up(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def start(self) -> LocalRayCluster:
        """Start both nodes and connect this process (the backend's own ``connect``);
        returns once both are alive."""
        from sandbox_kernel.backends.ray import cluster

        self._ray_start(["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                         f"--dashboard-port={free_port()}", "--min-worker-port=0", "--max-worker-port=0"], "head.log")
        # up when `ray start` says so (its GCS port answers earlier, before it serves)
        self._wait("head", lambda: self._started("head.log") and self._gcs_up())
        self._ray_start([f"--address={self.address}", f"--resources={json.dumps(WORKER_RESOURCES)}",
                         "--min-worker-port=0", "--max-worker-port=0"], "worker.log")
        self._wait("second node's start", lambda: self._started("worker.log"))
        cluster.connect(self.address, 30)
        self._wait("second node", lambda: len(cluster.live_nodes()) == 2)
        for n in cluster.live_nodes():
            if "sandbox_node" in n.total:
                self.worker_node_id = n.node_id
            else:
                self.head_node_id = n.node_id
        return self

    def add_node(self, resources: dict[str, float]) -> tuple[subprocess.Popen, str]:
        """Start one more node with ``resources``; returns its ``ray start`` process and its
        node id once it is alive.  Stopping it (:meth:`stop_node`) ends it at once, with no
        drain (``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0``: a stopped node would otherwise
        wait up to 30 s for its actors to leave)."""
        from sandbox_kernel.backends.ray import cluster

        before = {n.node_id for n in cluster.live_nodes()}
        log = f"node{len(self.procs)}.log"
        proc = self._ray_start([f"--address={self.address}", f"--resources={json.dumps(resources)}",
                                "--min-worker-port=0", "--max-worker-port=0"], log,
                               env={"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"})
        self._wait("the added node's start", lambda: self._started(log))
        self._wait("the added node", lambda: len({n.node_id for n in cluster.live_nodes()} - before) == 1)
        (node_id,) = {n.node_id for n in cluster.live_nodes()} - before
        return proc, node_id

    def stop_node(self, proc: subprocess.Popen) -> None:
        """Stop one node as its operator would: SIGTERM to its ``ray start --block``; returns
        once that process ended (its raylet and workers with it)."""
        self.stopped.append(proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    def stop(self) -> None:
        """Disconnect, end both ``ray start`` processes, then anything left in their sessions."""
        import ray
        from sandbox_kernel.backends.ray import cluster

        ray.shutdown()
        cluster._connected = None
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        sessions = {p.pid for p in self.procs}
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                if os.getsid(pid) in sessions:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def live_actors(prefix: str = "sandbox-kernel-") -> dict[str, dict]:
    """Actors of the cluster not dead, by id, whose name starts with ``prefix``: Ray's actor
    table as its control store (GCS) keeps it (``ray.util.state`` needs the dashboard,
    which the test's cluster does not run)."""
    from ray._private import state

    return {aid: a for aid, a in state.actors().items()
            if a.get("State") != "DEAD" and str(a.get("Name", "")).startswith(prefix)}


def actor_records(name: str) -> list[dict]:
    """Every record of the actor table named ``name`` (dead ones too, oldest first)."""
    from ray._private import state

    return sorted((a for a in state.actors().values() if a.get("Name") == name), key=lambda a: a.get("StartTime", 0))
