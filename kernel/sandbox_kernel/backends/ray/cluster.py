"""The proxy's side of a Ray cluster: connecting to it and asking whether a sandbox fits.

Pure helpers and the one place that calls ``ray.init``; the backend's verbs are
:mod:`.backend`'s.  ``ray`` is imported inside the functions that need it, so
importing this module (doctests, ``doctor``) needs no Ray.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import AdmissionRefused, BackendError, BackendNotFound

#: Bytes in a MiB: Ray counts ``memory`` in bytes, the policy in MiB.
MIB = 1 << 20
#: The namespace the proxy's Ray job and its sandbox actors live in.
NAMESPACE = "sandbox-kernel"

_lock = threading.Lock()
#: The address this process's ``ray.init`` connected to (one cluster per process).
_connected: str | None = None


def _ray() -> Any:
    """Import Ray (never at package import time)."""
    try:
        import ray
    except ImportError as err:
        raise BackendNotFound("the ray backend needs its extra: pip install 'sandbox-kernel[ray]'") from err
    return ray


def demand(memory_mib: int, cpu_cores: float, resources: Mapping[str, float]) -> dict[str, float]:
    """What one sandbox's actor asks of Ray's scheduler, in Ray's units.

    >>> demand(2048, 1.5, {"sandbox_node": 1})
    {'CPU': 1.5, 'memory': 2147483648.0, 'sandbox_node': 1.0}

    Returns
    -------
    dict
        ``CPU`` (cores), ``memory`` (bytes) and each custom resource (Ray's units).
    """
    return {"CPU": float(cpu_cores), "memory": float(memory_mib * MIB), **{k: float(v) for k, v in resources.items()}}


def show(resources: Mapping[str, float]) -> str:
    """Resources in words, memory in MiB.

    >>> show({"CPU": 2.0, "memory": 4294967296.0, "sandbox_node": 1.0})
    'memory 4096 MiB, CPU 2, sandbox_node 1'
    """
    parts = [f"memory {resources['memory'] / MIB:.0f} MiB"] if "memory" in resources else []
    parts += [f"{k} {v:g}" for k, v in resources.items() if k != "memory"]
    return ", ".join(parts)


@dataclass(frozen=True)
class Node:
    """One live node of the cluster as ``ray.nodes()`` describes it.

    Attributes
    ----------
    node_id : str
    ip : str
    total : dict
        Its resources (``CPU`` in cores, ``memory`` in bytes, custom ones in Ray's units).
    """

    node_id: str
    ip: str
    total: Mapping[str, float]


def no_node_fits(need: Mapping[str, float], nodes: list[Node], address: str) -> AdmissionRefused | None:
    """The refusal when no live node has, in total, what ``need`` asks (so Ray would keep
    the actor pending forever); None when one has (it may still be busy).

    The refusal's resource is the first one the largest node (most memory) lacks.

    >>> n = [Node("a" * 56, "10.0.0.2", {"CPU": 4.0, "memory": 8 * 2.0**30})]
    >>> err = no_node_fits(demand(16384, 1, {}), n, "10.0.0.1:6379")
    >>> err.details["resource"], err.details["need"], err.details["available"], err.details["unit"]
    ('memory', 16384, 8192, 'MiB')
    >>> no_node_fits(demand(4096, 1, {}), n, "10.0.0.1:6379") is None
    True
    """
    if any(all(n.total.get(k, 0.0) >= v for k, v in need.items()) for n in nodes):
        return None
    best = max(nodes, key=lambda n: n.total.get("memory", 0.0), default=None)
    short = next((k for k, v in need.items() if best is None or best.total.get(k, 0.0) < v), "memory")
    most = max((n.total.get(short, 0.0) for n in nodes), default=0.0)
    scale, unit = (MIB, "MiB") if short == "memory" else (1, "cores" if short == "CPU" else "units")
    offered = "; ".join(f"{n.ip} ({n.node_id[:8]}): {show({k: n.total.get(k, 0.0) for k in need})}"
                        for n in nodes[:8]) or "no live node"
    return AdmissionRefused(
        f"no node of the Ray cluster at {address} can hold this sandbox: it needs {show(need)}, and the most "
        f"{short} any node has is {most / scale:g} {unit} (nodes: {offered}); lower memory_mib or cpu_cores, "
        "change RayBackend.resources, or add a node that has them",
        resource=short, need=round(need[short] / scale), available=round(most / scale), unit=unit,
        nodes=len(nodes))


def not_placed(need: Mapping[str, float], free: Mapping[str, float], address: str, waited_s: float) -> AdmissionRefused:
    """The refusal when Ray did not place the actor within ``waited_s`` seconds although a
    node could hold it (the cluster is full): ``free`` is ``ray.available_resources()``.

    >>> err = not_placed(demand(1024, 1, {"gpu_box": 1}), {"CPU": 3.0, "memory": 2.0**33}, "h:1", 5)
    >>> err.details["resource"], err.details["need"], err.details["available"]
    ('gpu_box', 1, 0)
    """
    short = next((k for k, v in need.items() if free.get(k, 0.0) < v), "memory")
    scale, unit = (MIB, "MiB") if short == "memory" else (1, "cores" if short == "CPU" else "units")
    return AdmissionRefused(
        f"the Ray cluster at {address} did not place this sandbox within {waited_s:g} s: it needs {show(need)}, "
        f"free now across the cluster: {show({k: free.get(k, 0.0) for k in need})} (other work holds the rest); "
        "retry when kernels end, or raise RayBackend.placement_timeout_s",
        resource=short, need=round(need[short] / scale), available=round(free.get(short, 0.0) / scale), unit=unit,
        waited_s=waited_s)


def resolve_address(address: str) -> str:
    """``host:port`` of the cluster's GCS for ``address`` (``auto``: ``RAY_ADDRESS``, else
    the cluster last started on this machine, as Ray finds it).

    Raises
    ------
    BackendError
        No cluster is known for ``auto``, or the address is malformed.
    """
    _ray()
    from ray._private import services

    try:
        found = services.canonicalize_bootstrap_address(address)
    except (ValueError, ConnectionError) as err:
        raise BackendError(f"cannot use the Ray address {address!r}: {err}; set RayBackend.address to the "
                           "cluster's head, host:port (the port `ray start --head` printed)") from err
    if not found:
        raise BackendError(f"no Ray cluster found for address {address!r} (RAY_ADDRESS is unset and no `ray start` "
                           "ran on this machine); set RayBackend.address to the cluster's head, host:port")
    return found


def probe(host_port: str, timeout_s: float, given: str = "") -> None:
    """Open and close a TCP connection to the GCS at ``host_port`` within ``timeout_s``
    seconds: ``ray.init`` itself retries an unreachable address for minutes.

    Raises
    ------
    BackendError
        Naming the address (``given``, as configured, when it differs) and the socket's error.
    """
    named = f"{given} ({host_port})" if given and given != host_port else host_port
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as err:
        raise BackendError(f"the Ray cluster at {named} is unreachable ({type(err).__name__}: {err}); start "
                           "it (`ray start --head`) or set RayBackend.address to its head node's host:port") from err


def connect(address: str, timeout_s: float) -> str:
    """Connect this process to the cluster (``ray.init``), once; return its GCS address.

    The proxy becomes the cluster's driver, so the actors it creates are owned by it
    and end with it.  Nothing of this process's environment goes to the workers: no
    ``runtime_env`` is given (Ray then passes no environment variable of the driver),
    and this process's working directory (the notebook's folder) is kept off the
    workers' ``sys.path``, which Ray otherwise extends with it.  Worker logs are not
    forwarded here (``log_to_driver=False``).

    Called by :meth:`.backend.RayBackend.start` in a thread (it blocks).

    Raises
    ------
    BackendError
        Unreachable address (after ``timeout_s`` seconds), no cluster for ``auto``,
        or this process is already connected to another cluster.
    BackendNotFound
        Ray is not installed.
    """
    global _connected
    ray = _ray()
    with _lock:
        host_port = resolve_address(address)
        probe(host_port, timeout_s, address)
        if _connected is not None and ray.is_initialized():
            if _connected != host_port:
                raise BackendError(f"this process is connected to the Ray cluster at {_connected}, not {host_port}: "
                                   "one cluster per proxy process")
            return host_port
        from ray.job_config import JobConfig

        # Ray adds the driver's working directory to every worker's sys.path unless the
        # job is a client job (ray/_private/worker.py, "py_driver_sys_path").
        job_config = JobConfig(_client_job=True)
        try:
            ray.init(address=host_port, namespace=NAMESPACE, log_to_driver=False, job_config=job_config,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, TimeoutError) as err:
            with contextlib.suppress(Exception):
                ray.shutdown()
            raise BackendError(f"could not connect to the Ray cluster at {host_port}: {err}") from err
        _connected = host_port
        return host_port


def live_nodes() -> list[Node]:
    """The cluster's live nodes (``ray.nodes()``); needs :func:`connect` first."""
    ray = _ray()
    return [Node(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources") or {}))
            for n in ray.nodes() if n.get("Alive")]


#: How a node left, by Ray's ``NodeDeathInfo.Reason`` (``ray.nodes()``'s ``DeathReason``).
NODE_DEATH = {1: "was stopped", 2: "died", 3: "was preempted (drained)", 4: "was removed as idle (drained)"}


def node_gone(node: Mapping[str, Any]) -> str:
    """A dead node of ``ray.nodes()`` in words: which node, and how it left.

    >>> node_gone({"NodeID": "5edcd152a8510a28" * 3, "NodeManagerAddress": "10.0.0.7",
    ...            "NodeManagerHostname": "worker-3", "DeathReason": 2, "DeathReasonMessage": "health check failed"})
    'the Ray node 5edcd152a851 (10.0.0.7, host worker-3) died (health check failed)'
    """
    how = NODE_DEATH.get(int(node.get("DeathReason") or 0), "left the cluster")
    why = str(node.get("DeathReasonMessage") or "").strip()[:300]
    host = node.get("NodeManagerHostname")
    return (f"the Ray node {str(node.get('NodeID', '?'))[:12]} ({node.get('NodeManagerAddress', '?')}"
            f"{f', host {host}' if host else ''}) {how}" + (f" ({why})" if why else ""))


def loss_verdict(node_id: str, actor_name: str, wait_s: float, poll_s: float = 0.25) -> tuple[str, str]:
    """Ray's own account of a sandbox actor that stopped answering: whether its node died.

    Asks the cluster's control store (GCS), whose health checks are what declares a node
    dead, until it has ruled: the node ``node_id`` is dead, or the actor ``actor_name``
    is dead while its node lives.  A node that was stopped is dead here at once; one
    that vanished (a crash, a partition) is declared dead by Ray once its health checks
    fail (seconds to tens of seconds: Ray's ``health_check_*`` settings), and until then
    its actors are not declared dead either.

    Called by :meth:`.backend.RayBackend.exit_info` in a thread (it blocks, polling every
    ``poll_s`` seconds, for at most ``wait_s`` seconds).

    Returns
    -------
    tuple of (str, str)
        ``("node", words)``: the node is dead (:func:`node_gone`); ``("actor", "")``: the
        actor is dead, its node alive; ``("unknown", "")``: Ray had not ruled within
        ``wait_s`` seconds.
    """
    ray = _ray()
    deadline = time.monotonic() + wait_s
    while True:
        # the actor first: Ray marks a node dead before the actors on it, so a node read
        # after its actor was found dead shows a death that caused it
        try:
            ray.get_actor(actor_name, namespace=NAMESPACE)
            actor_dead = False
        except ValueError:  # no live actor of that name: Ray declared it dead
            actor_dead = True
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
        if node is not None and not node.get("Alive"):
            return "node", node_gone(node)
        if actor_dead:
            return "actor", ""
        if time.monotonic() >= deadline:
            return "unknown", ""
        time.sleep(poll_s)
