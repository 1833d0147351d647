"""The ``ray`` target (issue 31): a local two-node Ray cluster on loopback, for one run.

:func:`setup` starts a head and a second node as the Ray backend's tests do
(``tests/backends/ray_cluster.py``: two ``ray start --block`` children, each the
leader of its own session, ports and a temporary directory of their own, never
``ray stop``), with three differences: both nodes advertise and are reached on
a loopback address only (:data:`NODE_IP`); each node gets a fixed logical size
(:data:`NODE_CPUS` CPUs, :data:`NODE_MEMORY_MIB` of Ray ``memory``) so the 20-kernel
fleet is placed by the numbers, not by what this machine happens to have free; and
the nodes (so their Ray workers, where the sandboxes' actors run) get
:func:`node_env`, not this process's environment: nothing of the host's variables
or keys reaches a worker.  :func:`teardown` ends both nodes and anything left in
their sessions, by id.

The kernelspec ``sandbox-bench-ray`` points the Ray backend at the cluster with the
policy's defaults (as the ``gvisor`` target) and the idle lifecycle off.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.harness import Bench

#: The address both nodes advertise and are reached on: a loopback address, but not 127.0.0.1,
#: which ``ray start`` replaces with the machine's routable address (``resolve_ip_for_localhost``).
NODE_IP = "127.0.0.2"
#: Logical CPUs each node offers Ray (a sandbox's actor asks for its policy's ``cpu_cores``):
#: room for the 20-kernel fleet at 1 core each on the two nodes.  Ray's CPUs are a
#: scheduling count; the sandboxes' cgroups share this machine's 2 cores.
NODE_CPUS = 12
#: Ray ``memory`` each node offers, MiB (a sandbox's actor asks for its ``memory_mib``): one
#: kernel at the default 4096 MiB, or 16 of the fleet's 512 MiB, on either node.
NODE_MEMORY_MIB = 8192
#: The head node's own custom resource (the second node has ``sandbox_node`` and ``single_slot``,
#: ``tests/backends/ray_cluster.py``'s ``WORKER_RESOURCES``): a placement group asking for it
#: fills the head, so a sandbox is placed on the other node.
HEAD_RESOURCES = {"head_node": 1.0}
#: Ray's object store per node, MiB (a checkpoint image moved between nodes passes through it;
#: Ray's default is 30 % of memory).
NODE_OBJECT_STORE_MIB = 512
#: The only variables of this process a node (and so its workers) gets: where programs and
#: the code are, the locale, and the local backend's state and template folders.
NODE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "SANDBOX_KERNEL_STATE_DIR",
                 "SANDBOX_KERNEL_TEMPLATE_DIR")
#: Kernel options of every Ray kernelspec of the bench: the idle lifecycle off, as for the
#: emulated clouds (the ray backend has no pause yet: an idle kernel would be stopped).
IDLE_OFF = {"pause_after_s": 0, "checkpoint_after_s": 0, "stop_after_s": 0}

#: The running cluster (one per run).
_CLUSTER: list[Any] = []


def node_env() -> dict[str, str]:
    """The environment of the bench's Ray nodes: :data:`NODE_ENV_KEYS` only."""
    env = {k: os.environ[k] for k in NODE_ENV_KEYS if k in os.environ}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0"}


def _cluster_class() -> type:
    from tests.backends.ray_cluster import RAY, LocalRayCluster, free_port

    class BenchRayCluster(LocalRayCluster):  # type: ignore[misc]
        """:class:`LocalRayCluster` on :data:`NODE_IP`, of fixed size, with :func:`node_env`."""

        def __init__(self) -> None:
            super().__init__()
            self.address = f"{NODE_IP}:{self.port}"

        def _gcs_up(self) -> bool:
            try:
                socket.create_connection((NODE_IP, self.port), timeout=1).close()
                return True
            except OSError:
                return False

        def _ray_start(self, args: list[str], log: str) -> None:
            if "--head" in args:  # the resource a figure holds the head by (ray.py's checkpoint figure)
                args = [*args, f"--resources={json.dumps(HEAD_RESOURCES)}"]
            with open(Path(self.temp_dir) / log, "wb") as out:
                self.procs.append(subprocess.Popen(
                    [RAY, "start", "--block", f"--num-cpus={NODE_CPUS}", f"--memory={NODE_MEMORY_MIB << 20}",
                     f"--object-store-memory={NODE_OBJECT_STORE_MIB << 20}", f"--node-ip-address={NODE_IP}",
                     "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}", *args],
                    stdout=out, stderr=subprocess.STDOUT, env=node_env(), start_new_session=True))

    return BenchRayCluster


def address() -> str:
    """The running cluster's GCS address (``host:port``)."""
    return str(_CLUSTER[0].address)


def install_spec(bench: Bench, name: str, **options: Any) -> str:
    """Install kernelspec ``name`` (in the bench's prefix) on the running cluster; ``name``."""
    from sandbox_kernel.kernelspec import install
    install(name, backend="ray", prefix=bench.prefix, options={"address": address(), **IDLE_OFF, **options})
    return name


def setup(bench: Bench) -> None:
    """Start the cluster (this process joins it as a driver, to read its state) and install
    ``sandbox-bench-ray``; called by the run loop before the target is measured."""
    cluster = _cluster_class()()
    _CLUSTER.append(cluster)
    cluster.start()
    install_spec(bench, "sandbox-bench-ray")


def teardown(bench: Bench) -> None:
    """Stop the cluster started by :func:`setup` (its nodes, their workers, their sessions)."""
    while _CLUSTER:
        _CLUSTER.pop().stop()


def named_actors() -> list[str]:
    """Named actors alive on the cluster (a kernel's sandbox actor is ``sandbox-kernel-<id>``)."""
    import ray
    return sorted(a["name"] if isinstance(a, dict) else str(a)
                  for a in ray.util.list_named_actors(all_namespaces=True))


def describe() -> str:
    """The target's description (the table of targets)."""
    return (f"sandbox-kernel proxy, ray backend: each sandbox (gVisor) made by a Ray actor on a node of a "
            f"two-node Ray cluster started for the run on {NODE_IP} (`ray start` twice; {NODE_CPUS} CPUs and "
            f"{NODE_MEMORY_MIB} MiB of Ray memory a node, both on this machine), the framed channel carried by "
            "actor calls; the policy's defaults, idle lifecycle off; the nodes get PATH, HOME, the locale, "
            "PYTHONPATH and the state folders, nothing else of the host's environment")
