"""The Ray backend: the sandbox on a node of the team's own Ray cluster.

The proxy stays where Jupyter runs and becomes a driver of the cluster
(:func:`.cluster.connect`).  Each start creates one Ray actor
(:class:`.owner.SandboxOwner`) whose resource demand is the policy's
``memory_mib`` (Ray's ``memory``, bytes) and ``cpu_cores`` (``num_cpus``) plus
:attr:`RayBackend.resources` (custom resources, e.g. one a node was started
with to host sandboxes); Ray's scheduler picks the node.  On it the actor owns
one local sandbox made by the local backend's code (gVisor by default), and
carries the framed channel: :meth:`RayBackend.write` is one actor call per
batch of frames, :meth:`RayBackend.read` one pending actor call that returns
when the agent wrote something (at most :attr:`RayBackend.read_chunk_bytes`).

What it guarantees in this version:

* a cluster that cannot be reached is refused at start within
  :attr:`RayBackend.connect_timeout_s`, naming the address;
* a sandbox no live node could ever hold is refused at once, and one the cluster
  has no room for now after :attr:`RayBackend.placement_timeout_s`, both with the
  numbers (``AdmissionRefused``), never queued forever;
* the actor is owned by the proxy's Ray job (not detached): when the proxy dies,
  Ray ends the actor's worker, and the local watchdog on the node reaps the
  sandbox with it;
* a sandbox whose node dies or leaves is told as such: when the actor stops
  answering, Ray's own failure detection (its control store's node table and
  actor state: :func:`.cluster.loss_verdict`) says whether the node died and how,
  and the cause names the node and that the state was lost; the proxy then
  starts a new sandbox, which Ray places on a live node;
* nothing of the frontend's signing key or of the proxy's environment reaches
  the node: the actor gets the policy, the kernel id and the runtime options
  only (:func:`.cluster.connect` says what Ray itself passes).

* an idle sandbox is paused on its node (memory kept there), then checkpointed:
  the image is moved into Ray's object store as an object the proxy owns and the
  actor ends (the node keeps neither the sandbox nor the image on disk); the next
  request restores it in a new actor wherever Ray places it, on the node that took
  it or another (:meth:`RayBackend.checkpoint`, :meth:`RayBackend.resume`).

* ``network=allowlist`` is enforced on the node by the local backend's own egress proxy,
  run by the actor; its records come back with the channel (:mod:`.egress`), so each
  denial shows in the cell that made it and ``kernel_info`` lists the attempts.

* the workspace (``workspace`` ``ro``/``rw``) is copied, as for E2B and Modal: the node's
  sandbox works in an empty folder (:func:`.owner.node_policy`) which the proxy fills at
  each fresh sandbox and, with ``rw``, copies back on ``sync`` and at shutdown
  (:mod:`sandbox_kernel.workspace_copy`; :attr:`workspace_mount` is False).

* snapshot, rewind and fork as a local gVisor kernel's (:mod:`.copies`): the node takes the
  image, the proxy keeps it on its machine's disk (the local snapshot folders, bounds and
  ``gc``); a rewind or a fork restores it on a new actor wherever Ray places it, made its
  own on the node by the local backend's reseed.

Not yet (issue 31): ``ro_paths``, usage figures.

Ray is imported in :mod:`.cluster` and here only inside methods
(``pip install 'sandbox-kernel[ray]'``); importing :mod:`sandbox_kernel` never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from traitlets import CaselessStrEnum, Dict, Float, Int, Unicode

from ...errors import SandboxDied, SandboxStartError, SnapshotError
from ...policy import Policy
from ..base import EGRESS_FIELDS, TAG, Capabilities, ExitInfo, SandboxBackend, ready_timeout_trait, seconds_trait
from . import cluster
from .cluster import MIB
from .copies import RayCopies
from .egress import MirroredEgressLog
from .owner import MAX_READ_BYTES, SandboxOwner

#: The actor's whole ``runtime_env``: fixed values, nothing of the proxy's environment.  A
#: Ray worker that exits kills its child processes (``kill_child_processes_on_worker_exit``),
#: the sandbox's watchdog among them, which would leave the sandbox's state directory and
#: cgroup behind; with this off, the watchdog outlives the worker and reaps the sandbox, as
#: it does when a local proxy dies.
WORKER_ENV = {"RAY_kill_child_processes_on_worker_exit": "false"}

#: Seconds :meth:`RayBackend.kill` waits for the actor to remove its sandbox before it
#: kills the actor (the node's watchdog then reaps the sandbox).
KILL_WAIT_S = 10.0


class RayBackend(RayCopies, SandboxBackend):
    """One sandbox on a node of a Ray cluster; see the module docstring.

    Parameters
    ----------
    policy : Policy
        ``memory_mib`` (MiB) and ``cpu_cores`` (cores) are the actor's resource demand
        and the sandbox's limits on the node; ``pids_max``, ``scratch_mib``, ``env`` and
        ``network`` (an allowlist by the local egress proxy, on the node) are enforced there
        as locally.
    kernel_id : str
        Names the actor (``sandbox-kernel-<kernel id>`` in namespace ``sandbox-kernel``)
        and the sandbox on the node.
    log, **kwargs
        See :class:`SandboxBackend`; the options below are traits
        (``--RayBackend.address=10.0.0.1:6379``).
    """

    name = "ray"
    display_name = "Ray cluster"
    enforced_fields = frozenset({"memory_mib", "cpu_cores", "pids_max", "scratch_mib", "network", "env",
                                 "workspace", "workspace_path", *EGRESS_FIELDS})
    egress_enforcement = (
        "as the local backend, on the sandbox's node: HTTP CONNECT and absolute-URI http:// only, through "
        "the local filtering proxy the node's actor runs (a unix socket, the sandbox has no other interface): "
        "names and *.wildcards of allow_domains, ports of allow_ports, names resolved on the node with "
        "loopback, private, link-local, multicast and reserved answers refused unless egress_resolve names "
        "them (addresses as the node sees them), IP literals refused unless listed, no DNS inside, per-cell "
        "connection and byte caps; every attempt recorded and brought to the kernel with the channel; no "
        "checkpoint at idle (the sandbox stays paused on its node)")

    address = Unicode("auto", config=True, help="The Ray cluster: its head's GCS address host:port (the port "
                      "`ray start --head` printed), or auto (RAY_ADDRESS, else the cluster last started on this "
                      "machine). Default: auto.")
    resources = Dict(value_trait=Float(min=0.0), config=True,
                     help="Custom Ray resources a sandbox's actor needs besides memory_mib and cpu_cores, name=amount "
                     "(--RayBackend.resources=sandbox_node=1): places sandboxes on the nodes started with them "
                     "(`ray start --resources`). Default: none.")
    runtime = CaselessStrEnum(["gvisor", "bubblewrap", "auto"], "gvisor", config=True,
                              help="The local runtime on the node (LocalBackend.runtime there): gvisor, bubblewrap "
                              "(a shared-kernel sandbox), or auto. Default: gvisor.")
    runsc_path = Unicode("", config=True, help="The runsc binary on the nodes ('' = as the local backend finds "
                         "it). Default: ''.")
    connect_timeout_s = seconds_trait(10.0, "How long the start waits for the cluster's address to answer "
                                      "before it is refused as unreachable.")
    placement_timeout_s = seconds_trait(60.0, "How long a start waits for Ray to place the sandbox's actor "
                                        "on a node that has room; then it is refused with the numbers.")
    read_chunk_bytes = Int(MAX_READ_BYTES, min=4096, max=MAX_READ_BYTES, config=True,
                           help=f"The most bytes of the agent's output one actor call carries. Unit: bytes. "
                           f"Default: {MAX_READ_BYTES}.")
    ready_timeout_s = ready_timeout_trait(180.0)
    fork_from = Unicode("", config=True, help="Set by the client that starts a fork (never by hand): the "
                        "hand-off directory of a fork_request whose image this kernel's first sandbox is "
                        "restored from, on a node Ray picks. Default: '' (a fresh sandbox).")
    lost_wait_s = seconds_trait(60.0, "How long, once the sandbox's actor stopped answering, the backend waits "
                                "for Ray to declare its node or the actor dead (a vanished node is declared dead "
                                "when Ray's health checks fail) before it reports the sandbox lost without a "
                                "verdict.")

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None, **kwargs: Any):
        super().__init__(policy, kernel_id, log, **kwargs)
        #: The node's egress records (``network=allowlist``), brought by :meth:`read`.
        self.egress_log: MirroredEgressLog = MirroredEgressLog()
        self._actor: Any = None
        #: A checkpoint's image: an ObjectRef this proxy owns, and where it was taken.
        self._image: Any = None
        self._image_info: dict[str, Any] = {}
        #: Counts the streams :meth:`start` began (a restore goes on with the same one).
        self._stream = 0
        self._where: dict[str, Any] = {}
        self._gcs: str | None = None
        self._write_lock = asyncio.Lock()
        #: Why the sandbox is gone, once known (the cause :meth:`exit_info` reports).
        self._lost: str | None = None
        #: The actor call's error that ended the stream, until :meth:`exit_info` explains it.
        self._lost_err: BaseException | None = None

    @property
    def capabilities(self) -> Capabilities:
        """Pause on the node, memory kept; checkpoint under gVisor, the image moved through
        Ray's object store so the restore may land on another node."""
        boundary = self._where.get("boundary") or (
            "gVisor user-space kernel on a Ray node" if self.runtime == "gvisor" else f"{self.runtime} on a Ray node")
        gvisor = self._where.get("runtime", self.runtime) == "gvisor"
        # A restore on a new node has no egress proxy socket of its own yet (as a local rewind).
        return Capabilities(boundary=f"{boundary} (Ray)" if "Ray" not in boundary else boundary,
                            pause_keeps_memory=True, checkpoint=gvisor and self.policy.network == "none")

    async def doctor(self) -> list[str]:
        """Whether the cluster's address resolves and answers (a TCP connection, no
        ``ray.init``: ``doctor`` joins no cluster); called by ``sandbox-kernel doctor``.
        Whether this machine can host sandboxes is :meth:`host_report`'s.

        Returns
        -------
        list of str
            Problems, each with its next step; empty when the address answers.
        """
        try:
            host_port = await asyncio.to_thread(cluster.resolve_address, self.address)
            await asyncio.to_thread(cluster.probe, host_port, self.connect_timeout_s, self.address)
        except Exception as err:  # noqa: BLE001 - reported as the problem it is
            return [str(err)]
        return []

    async def host_report(self) -> dict[str, Any]:
        """Whether this machine can host Ray sandboxes (:func:`.node.host_report`: Ray
        importable, :attr:`runtime` usable: runsc found and running); called by
        ``sandbox-kernel doctor`` on a node."""
        from . import node

        return await asyncio.to_thread(node.host_report, self.runtime, self.runsc_path)

    @property
    def _actor_name(self) -> str:
        return f"{TAG}-{self.kernel_id}"

    def _demand(self) -> dict[str, float]:
        return cluster.demand(self.policy.memory_mib, self.policy.cpu_cores, self.resources)

    def describe(self) -> dict:
        d = super().describe()
        d["ray"] = {"address": self._gcs or self.address, "resources": dict(self.resources),
                    "actor": self._actor_name, **self._where,
                    **({"checkpoint": dict(self._image_info)} if self._image is not None else {})}
        if "runtime" in self._where:
            d["runtime"] = self._where["runtime"]
        return d

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        """Place the actor, then start the sandbox in it.

        Called by the proxy at kernel start and after the sandbox died or was stopped.

        Raises
        ------
        BackendError
            The cluster is unreachable (naming the address) or Ray is not installed.
        AdmissionRefused
            No live node could hold the sandbox (at once), or none had room within
            :attr:`placement_timeout_s`; the message has the numbers.
        SandboxStartError
            The node could not start the sandbox (its stderr tail, as locally).
        """
        await self.kill()
        self._lost = self._lost_err = None
        self._stream += 1  # a new stream: a reader of the previous one ends
        if self.fork_from:  # a fork's first sandbox: its source's image restored (.copies)
            return await self._start_fork()
        actor = await self._place()
        try:
            self._where = await actor.start.remote()
        except BaseException as err:
            await self.kill()
            raise self._map(err, "start the sandbox on the Ray node") from err
        self.log.info("sandbox started on Ray node %s (%s): %s", self._where.get("node_ip"),
                      self._where.get("node_id", "?")[:8], self.capabilities.boundary)

    async def _place(self) -> Any:
        """Connect, then create the sandbox's actor and wait until Ray placed it (at most
        :attr:`placement_timeout_s`); it becomes :attr:`_actor`.  Called by :meth:`start`
        and by :meth:`resume` (a restore from a checkpoint, on whichever node Ray picks).

        Raises
        ------
        BackendError, AdmissionRefused
            As :meth:`start`; the actor is gone again.
        """
        self._gcs = await asyncio.to_thread(cluster.connect, self.address, self.connect_timeout_s)
        import ray

        need = self._demand()
        refusal = cluster.no_node_fits(need, await asyncio.to_thread(cluster.live_nodes), self._gcs)
        if refusal is not None:
            raise refusal
        options = {"runtime": self.runtime, **({"runsc_path": self.runsc_path} if self.runsc_path else {})}
        # Owned by this driver (never detached: it ends with the proxy), never restarted (a
        # restarted actor would be a new, empty sandbox behind the same handle), a runtime_env
        # of WORKER_ENV only (nothing of this process's environment).
        owner: Any = ray.remote(SandboxOwner)
        actor = owner.options(
            name=self._actor_name, namespace=cluster.NAMESPACE, num_cpus=need["CPU"], memory=need["memory"],
            resources={k: v for k, v in need.items() if k not in ("CPU", "memory")}, max_restarts=0,
            max_task_retries=0, max_concurrency=16, runtime_env={"env_vars": dict(WORKER_ENV)},
        ).remote(self.policy, self.kernel_id, options)
        self._actor = actor
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.wrap_future(actor.__ray_ready__.remote().future()),
                                   self.placement_timeout_s)
        except TimeoutError:
            free = await asyncio.to_thread(ray.available_resources)
            await self._end_actor(graceful=False)  # never placed: nothing to remove on a node
            raise cluster.not_placed(need, free, self._gcs, round(time.monotonic() - t0, 1)) from None
        except BaseException:
            await self._end_actor()
            raise
        return actor

    def _map(self, err: BaseException, doing: str) -> BaseException:
        """An error of an actor call in this package's terms (the caller raises ``from``)."""
        import ray.exceptions as rex

        if isinstance(err, rex.RayTaskError):
            cause = err.as_instanceof_cause()
            if isinstance(cause, (SandboxStartError, SandboxDied)):
                return cause
            if isinstance(cause, SnapshotError):  # the node's refusal, in its own words
                return SnapshotError(str(getattr(err, "cause", None) or cause),
                                     getattr(cause, "ename", "SnapshotFailed"))
            return SandboxStartError(f"could not {doing}: {type(cause).__name__}: {cause}")
        if isinstance(err, rex.RayActorError):
            self._lost_err = err  # exit_info asks Ray why
            node = f"{str(self._where.get('node_id', '?'))[:12]} ({self._where.get('node_ip', '?')})"
            return SandboxDied(f"the sandbox's Ray actor on node {node} stopped answering "
                               f"({type(err).__name__}); the sandbox's state was lost")
        return err

    async def read(self) -> bytes:
        """Next chunk of the agent's stdout; ``b""`` once the stream ended (the agent or the
        sandbox ended, or the actor or its node is gone).

        Called in a loop by the proxy's reader task; one actor call is pending at a time.
        A call to an actor that a restore replaced (:meth:`resume` after a checkpoint: the
        same stream, as a local restore's) goes on with the new actor rather than end it.
        """
        stream = self._stream
        while True:
            actor = self._actor
            if actor is None:
                return b""
            data: bytes | None
            try:
                data, egress = await actor.read.remote(self.read_chunk_bytes)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the stream ended: exit_info says why
                if self._actor is actor:
                    self._lost_err = err
                    self.log.warning("the sandbox's Ray actor stopped answering: %s: %s", type(err).__name__,
                                     str(err)[:300])
                data, egress = b"", None
            if egress:
                self.egress_log.apply(egress)
            if data is None:  # egress records only: the agent wrote nothing yet
                if self._stream == stream:
                    continue
                data = b""
            if data or self._stream != stream or self._actor in (None, actor):
                return data

    async def write(self, data: bytes) -> None:
        """Send whole frames to the agent's stdin, one actor call at a time.

        Raises
        ------
        SandboxDied
            No sandbox, or the actor or its node is gone.
        """
        actor = self._actor
        if actor is None:
            raise SandboxDied("the sandbox on the Ray cluster is not running")
        async with self._write_lock:
            try:
                await actor.write.remote(bytes(data), self.egress_log.current_cell())
            except Exception as err:
                mapped = self._map(err, "write to the agent")
                if isinstance(mapped, SandboxDied):
                    raise mapped from err
                raise SandboxDied(f"could not write to the agent on the Ray node ({mapped})") from err

    async def exit_info(self) -> ExitInfo:
        """Why the stream ended: the node's own account (:meth:`LocalBackend.exit_info`), or,
        when the actor stopped answering, Ray's verdict on its node (:meth:`_loss`).

        Called by the proxy after :meth:`read` returned ``b""``; waits at most
        :attr:`lost_wait_s` seconds for Ray's verdict.

        Returns
        -------
        ExitInfo
            Its ``cause`` names the node and says the state was lost when the node died.
        """
        actor = self._actor
        if actor is None:
            return ExitInfo(cause="the sandbox on the Ray cluster was not running")
        if self._lost is None and self._lost_err is None:
            try:
                cause, rc = await asyncio.wait_for(asyncio.wrap_future(actor.exit_info.remote().future()), 15)
                return ExitInfo(cause=cause, returncode=rc)
            except Exception as err:  # noqa: BLE001 - the actor is gone too: Ray says why
                self._lost_err = err
        if self._lost is None:
            self._lost = await self._loss(self._lost_err)
        return ExitInfo(cause=f"{self._lost}; the sandbox's state was lost")

    async def _loss(self, err: BaseException | None) -> str:
        """The sandbox's loss in words, from Ray's verdict (:func:`.cluster.loss_verdict`):
        its node died (which node, how), its actor ended on a live node, or no verdict."""
        node_id, ip = str(self._where.get("node_id", "")), self._where.get("node_ip", "?")
        kind, words = await asyncio.to_thread(cluster.loss_verdict, node_id, self._actor_name, self.lost_wait_s)
        if kind == "node":
            return f"{words}, and the sandbox on it with it"
        detail = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}" if err is not None else "no answer"
        if kind == "actor":
            return f"the sandbox's Ray actor on node {node_id[:12]} ({ip}) ended, its node alive ({detail})"
        return (f"lost contact with the sandbox's Ray actor on node {node_id[:12]} ({ip}); Ray had not declared "
                f"the node or the actor dead after {self.lost_wait_s:g} s ({detail})")

    def explain_interpreter_death(self, cause: str) -> str:
        """The node's explanation of an interpreter death (the memory limit it hit):
        one actor round trip, blocking (rare: only when the agent reports a death)."""
        actor = self._actor
        if actor is None:
            return cause
        import ray

        try:
            return ray.get(actor.explain_interpreter_death.remote(cause), timeout=5)
        except Exception:  # noqa: BLE001 - the agent's own words stand
            return cause

    # -- idle levels --------------------------------------------------------------

    async def pause(self) -> None:
        """Freeze the sandbox on its node, memory kept there (the actor's
        :meth:`~.owner.SandboxOwner.pause`); called by the idle lifecycle.  The actor and
        its Ray resources stay: a paused kernel still holds its node's memory.

        Raises
        ------
        SandboxDied, SandboxStartError
            The actor is gone, or the node could not freeze it.
        """
        await self._call("pause", "pause the sandbox")

    async def checkpoint(self) -> None:
        """Checkpoint the sandbox on its node and move the image into Ray's object store
        (:meth:`~.owner.SandboxOwner.checkpoint_out`: an object this proxy owns, kept in that
        node's store), then end the actor: the node frees the sandbox's memory, CPUs and
        Ray resources, and keeps nothing on disk.  :meth:`resume` restores it on whichever
        node Ray places the new actor.  Called by the idle lifecycle after a pause.

        Raises
        ------
        SandboxDied, SandboxStartError
            The actor is gone, or the node could not checkpoint (the sandbox stays).
        """
        actor = self._actor
        if actor is None:
            raise SandboxDied("the sandbox on the Ray cluster is not running")
        info_ref, image_ref = actor.checkpoint_out.options(num_returns=2).remote()
        try:
            info = await info_ref
        except Exception as err:
            raise self._map(err, "checkpoint the sandbox on the Ray node") from err
        self._image, self._image_info = image_ref, {
            "node_id": info.get("node_id"), "node_ip": info.get("node_ip"), "image_bytes": info.get("image_bytes")}
        await self._end_actor(graceful=False)  # its sandbox is already removed
        self.log.info("sandbox checkpointed on Ray node %s: %d bytes in the object store",
                      str(info.get("node_id"))[:8], info.get("image_bytes") or 0)

    async def resume(self) -> None:
        """Thaw a paused sandbox, or restore a checkpointed one: a new actor placed by Ray
        (any node with room: the one that took the checkpoint or another) pulls the image
        from the object store and restores it (:meth:`~.owner.SandboxOwner.restore_in`).
        :attr:`notice` then says where it moved from.  Called before the next request.

        Raises
        ------
        AdmissionRefused
            No node has room within :attr:`placement_timeout_s`: it stays checkpointed.
        SandboxDied, SandboxStartError
            The actor, the node or the image is gone, or the node could not restore it.
        """
        if self._image is None:
            await self._call("resume", "resume the sandbox")
            return
        await self.restore_image(self._image, interrupt=False, doing="restore the sandbox's checkpoint on the Ray node")
        was, self._image, self._image_info = self._image_info, None, {}
        here = self._where.get("node_id")
        self.notice = (f"moved from Ray node {str(was.get('node_id'))[:12]} to {str(here)[:12]} "
                       f"({self._where.get('node_ip')}): {was.get('image_bytes', 0) / MIB:.0f} MiB of checkpoint "
                       "through Ray's object store") if was.get("node_id") != here else None
        self.log.info("sandbox restored on Ray node %s%s", str(here)[:8], f"; {self.notice}" if self.notice else "")

    async def _call(self, method: str, doing: str) -> Any:
        """One call of the actor's ``method``, its errors in this package's terms."""
        actor = self._actor
        if actor is None:
            raise SandboxDied("the sandbox on the Ray cluster is not running")
        try:
            return await getattr(actor, method).remote()
        except Exception as err:
            raise self._map(err, doing) from err

    async def kill(self, graceful: bool = True) -> None:
        """Remove the sandbox (the actor's :meth:`~.owner.SandboxOwner.kill`), then kill
        the actor, and drop a checkpoint's image (Ray frees it).  Idempotent; called at
        shutdown, restart and stop.  An actor that does not answer within
        :data:`KILL_WAIT_S` (or, without ``graceful``, at once) is killed anyway: its node's
        watchdog reaps the sandbox when the worker ends."""
        self._image, self._image_info = None, {}
        await self._end_actor(graceful)

    async def _end_actor(self, graceful: bool = True) -> None:
        """:meth:`kill` of the actor alone (a checkpoint's image kept)."""
        actor, self._actor = self._actor, None
        self._where = {}
        if actor is None:
            return
        import ray

        if graceful:
            try:
                await asyncio.wait_for(asyncio.wrap_future(actor.kill.remote().future()), KILL_WAIT_S)
            except Exception as err:  # noqa: BLE001 - killed below; the node's watchdog reaps
                self.log.warning("the sandbox's actor did not remove its sandbox (%s: %s); killing it",
                                 type(err).__name__, err)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
