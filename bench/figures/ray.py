"""The Ray backend at fleet scale (issue 31): 20 kernels started at once on the local cluster.

Start, the trivial cell and the 1 MB image through the Ray backend are the ``ray``
target's ``cold_start``, ``trivial_rtt`` and ``image_rtt`` (``bench/raycluster.py``),
measured beside ``stock`` and ``gvisor``.  Here: :data:`FLEET_KERNELS` kernels launched
at once on the two-node cluster, each sandbox placed by Ray's scheduler; and a
checkpoint taken on one node and restored on the other, where the backend checkpoints
(its ``capabilities.checkpoint``: the image moved through Ray's object store; a backend
without it measures nothing and says so).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import raycluster
from bench.figures._registry import Figure, register
from bench.figures.fleet import quiet_stop
from bench.harness import Context, Running, sandbox_info, say, timed_cell, wait_state

#: Kernels started at once.
FLEET_KERNELS = 20
#: Each fleet kernel's policy: 20 x 512 MiB fit local admission (10,240 MiB of this machine's
#: 23,128) and Ray's memory (2 x ``NODE_MEMORY_MIB``); 20 x 1 core fit its 2 x ``NODE_CPUS``.
FLEET_POLICY = {"memory_mib": 512, "cpu_cores": 1}


def fig_ray_fleet(ctx: Context, n: int) -> dict[str, Any]:
    """``n`` times: :data:`FLEET_KERNELS` kernels launched at once (one thread each), each
    sent ``pass`` as soon as launched; the time until the last ``execute_reply``; where Ray
    placed them; all shut down, then no sandbox actor left on the cluster."""
    name = raycluster.install_spec(ctx.bench, "sandbox-bench-ray-fleet", **FLEET_POLICY)
    target = dataclasses.replace(ctx.target, kernel_name=name)
    all_ready: list[float] = []
    each: list[float] = []
    extra: dict[str, Any] = {"kernels": FLEET_KERNELS, **FLEET_POLICY, "nodes": {}, "actors_left": []}

    def first(k: Running) -> float:
        return k.first_reply_s(timeout=300)

    for _ in range(n):
        kernels: list[Running] = []
        try:
            with ThreadPoolExecutor(FLEET_KERNELS) as pool:
                t0 = time.perf_counter()
                kernels = list(pool.map(lambda _: Running(ctx.bench, target), range(FLEET_KERNELS)))
                each += list(pool.map(first, kernels))
                all_ready.append(time.perf_counter() - t0)
            for k in kernels:
                node = sandbox_info(k)["ray"]["node_id"][:12]
                extra["nodes"][node] = extra["nodes"].get(node, 0) + 1
        finally:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(quiet_stop, kernels))
        time.sleep(2.0)
        extra["actors_left"] += [a for a in raycluster.named_actors() if a.startswith("sandbox-kernel")]
        say(f"  ray fleet: all {FLEET_KERNELS} ready in {all_ready[-1]:.1f} s; nodes {extra['nodes']}; "
            f"actors left {extra['actors_left']}")
    return {"ray_fleet_all_ready": all_ready, "ray_fleet_first_reply": each,
            "_extra": {"ray_fleet_all_ready": extra}}


_HOW = (f"{FLEET_KERNELS} kernels on the two-node local Ray cluster (memory_mib={FLEET_POLICY['memory_mib']}, "
        f"cpu_cores={FLEET_POLICY['cpu_cores']}: each sandbox's actor asks Ray for them), launched at once by "
        f"jupyter_client from {FLEET_KERNELS} threads, each sent `pass` as soon as launched. Both nodes and every "
        "sandbox share this machine's 2 cores")
register("ray_fleet_all_ready", Figure(
    f"Ray: {FLEET_KERNELS} kernels started at once, until all answered", "s", fig_ray_fleet, n=1, n_quick=1,
    kind="fresh", targets=("ray",), rounds=1, plot=False,
    note=_HOW + ": from the first launch to the last execute_reply. Where Ray placed them (per node) and the "
                "sandbox actors left once all were shut down are in the JSON (`nodes`, `actors_left`)."))
register("ray_fleet_first_reply", Figure(
    f"Ray: {FLEET_KERNELS} kernels started at once, each launch to its first reply", "s", None, n=0,
    n_quick=0, kind="fresh", produced_by="ray_fleet_all_ready", targets=("ray",), plot=False,
    note=_HOW + ": each kernel's own launch to its first execute_reply."))


#: The checkpoint figure's kernel: seconds idle before the freeze and the checkpoint.
MOVE_PAUSE_AFTER_S, MOVE_CHECKPOINT_AFTER_S = 1.0, 3.0


def ray_checkpoints() -> bool:
    """Whether this version's Ray backend checkpoints a gVisor sandbox (no cluster needed)."""
    from sandbox_kernel.backends.ray import RayBackend
    from sandbox_kernel.policy import Policy
    return bool(RayBackend(Policy(**FLEET_POLICY), "bench-probe").capabilities.checkpoint)


def _held(bundle: dict[str, float]) -> Any:
    """A placement group of one ``bundle``, once Ray has reserved it (it fills a node)."""
    import ray
    from ray.util.placement_group import placement_group
    pg = placement_group([bundle])
    ray.get(pg.ready(), timeout=120)
    return pg


def fig_ray_checkpoint_moved(ctx: Context, n: int) -> dict[str, Any]:
    """``n`` times: a kernel placed on the second node (the head held by a placement group),
    ``x = 41``; the head freed and the second node held; once kernel_info says
    ``checkpointed`` (the image in Ray's object store, the actor ended), ``x += 1`` timed
    to its execute_reply (a new actor on the head pulls and restores the image), ``x`` and
    the node checked."""
    from ray.util.placement_group import remove_placement_group

    from tests.backends.ray_cluster import WORKER_RESOURCES

    if not ray_checkpoints():
        say("  ray_checkpoint_moved: this Ray backend has no checkpoint (capabilities.checkpoint): not measured")
        return {}
    name = raycluster.install_spec(ctx.bench, "sandbox-bench-ray-move", **FLEET_POLICY,
                                   pause_after_s=MOVE_PAUSE_AFTER_S, checkpoint_after_s=MOVE_CHECKPOINT_AFTER_S)
    target = dataclasses.replace(ctx.target, kernel_name=name)
    head = {"CPU": float(raycluster.NODE_CPUS), **raycluster.HEAD_RESOURCES}
    second = {"CPU": float(raycluster.NODE_CPUS), "sandbox_node": WORKER_RESOURCES["sandbox_node"]}
    moved: list[float] = []
    extra: dict[str, Any] = {"image_mib": [], **FLEET_POLICY, "pause_after_s": MOVE_PAUSE_AFTER_S,
                             "checkpoint_after_s": MOVE_CHECKPOINT_AFTER_S}
    for _ in range(n):
        holds = [_held(head)]
        k = Running(ctx.bench, target)
        try:
            k.first_reply_s(timeout=300)
            k.ensure_iopub()
            timed_cell(k, "x = 41", "41")
            taken = sandbox_info(k)["ray"]["node_id"]
            remove_placement_group(holds.pop())
            info = wait_state(k, "checkpointed", timeout=120)
            extra["image_mib"].append(round(info["ray"]["checkpoint"]["image_bytes"] / (1 << 20), 1))
            holds.append(_held(second))  # the node that took it, now free, is filled: the restore goes to the head
            moved.append(timed_cell(k, "x += 1", "42", timeout=300))
            landed = sandbox_info(k)["ray"]["node_id"]
            if landed == taken:
                raise RuntimeError(f"the checkpoint was restored on the node that took it ({taken[:12]})")
        finally:
            quiet_stop(k)
            for pg in holds:
                remove_placement_group(pg)
    return {"ray_checkpoint_moved": moved, "_extra": {"ray_checkpoint_moved": extra}}


register("ray_checkpoint_moved", Figure(
    "Ray: a checkpoint moved to the other node, to the cell's reply", "s", fig_ray_checkpoint_moved, n=3,
    n_quick=1, kind="fresh", targets=("ray",), rounds=1, plot=False,
    note=f"A kernel (memory_mib={FLEET_POLICY['memory_mib']}, pause_after_s={MOVE_PAUSE_AFTER_S:g}, "
         f"checkpoint_after_s={MOVE_CHECKPOINT_AFTER_S:g}) placed on the second node while a placement group "
         "holds the head; `x = 41`; the head freed, the second node held; once kernel_info says `checkpointed` "
         "(the image in the object store of the node that took it, the actor ended), `x += 1` is timed to its "
         "execute_reply: a new actor placed on the head pulls the image through Ray's object store and "
         "restores it; `x` and the node checked. The image's size is in the JSON (`image_mib`). Measured "
         "only where the Ray backend checkpoints."))
