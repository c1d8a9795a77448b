"""What to say when verl's run on Ray stops or stalls before training.

verl's own errors at this point are a worker's traceback (an NCCL or CUDA error that does
not say on which node), or none at all: verl waits for its placement groups without a time
limit, so a cluster that cannot host its workers (a node's GPUs held by another job, too few
CPUs beside them) leaves the run waiting forever. :class:`PlacementWatch` bounds that wait,
and :func:`explain_worker_failure` names the nodes without the devices Ray declares.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from rl_pipeline.engines.verl.cluster import (
    cuda_devices,
    no_cuda_device,
    node_label,
    on_each_node,
)

logger = logging.getLogger(__name__)


class WorkerDeviceError(RuntimeError):
    """verl's GPU workers could not initialise their devices: nodes without CUDA devices."""


class WorkerPlacementError(RuntimeError):
    """verl's workers could not be placed on the Ray cluster within the time allowed."""


def explain_worker_failure() -> str | None:
    """Why verl's run on the connected Ray cluster failed, when it is a node without the CUDA
    devices Ray declares: where verl placed its GPU workers, and which nodes lack devices.

    Called after ``run_ppo`` raised, before Ray is shut down. None when every node that
    declares GPUs has them (the failure is something else: verl's own error stands).
    """
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    placed = _gpu_workers_by_node()
    probed = [nodes[i] for i in (placed or nodes) if i in nodes
              and nodes[i]["Resources"].get("GPU", 0)]
    counts = on_each_node(probed, cuda_devices)
    missing = [no_cuda_device(node_label(n), n["Resources"]["GPU"], seen)
               for n, seen in zip(probed, counts, strict=True) if seen < n["Resources"]["GPU"]]
    if not missing:
        return None
    where = (f"verl placed its GPU workers on {len(placed)} node(s): " + ", ".join(
        f"{node_label(nodes[i]) if i in nodes else i[:8]} ({n} worker(s))"
        for i, n in placed.items()) + ". ") if placed else ""
    return ("verl's workers stopped at device initialisation: " + "; ".join(missing) + ". "
            + where + "Start Ray on each node with the GPUs it has (`ray start` counts them "
            "when --num-gpus is left out) from an environment with the CUDA build of torch "
            "(docs/gpu.md, troubleshooting); `kedro run --pipelines preflight` reports every "
            "node.")


class PlacementWatch:
    """Bound verl's wait for its placement groups (the GPUs and CPUs of its workers).

    A thread polls the cluster's placement groups while verl runs. One of this job's that
    is still pending after ``timeout_s`` is removed, which ends verl's wait with an error,
    and :attr:`reason` says what could not be placed and what the nodes have; the caller
    raises :class:`WorkerPlacementError` with it. ``timeout_s=None`` watches nothing.
    """

    def __init__(self, timeout_s: float | None, poll_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="verl-placement-watch",
                                        daemon=True)

    def __enter__(self) -> PlacementWatch:
        if self.timeout_s is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _watch(self) -> None:
        import ray

        pending_since: dict[str, float] = {}
        while not self._stop.wait(self.poll_s):
            if not ray.is_initialized():  # run_ppo has not connected yet
                continue
            try:
                # A placement group's id ends with its job's id (Ray's ID layout): verl's
                # TaskRunner belongs to this driver's job, other jobs' groups are not ours.
                job = ray.get_runtime_context().get_job_id()
                table = ray.util.placement_group_table()
            except Exception:  # noqa: BLE001 - Ray shutting down under us; stop watching
                return
            now = time.monotonic()
            pending = {i: pg for i, pg in table.items()
                       if i.endswith(job) and pg["state"] == "PENDING"}
            pending_since = {i: pending_since.get(i, now) for i in pending}
            stuck = [i for i, since in pending_since.items() if now - since >= self.timeout_s]
            if stuck:
                self.reason = _placement_reason([table[i] for i in stuck], self.timeout_s)
                logger.error("%s", self.reason)
                for i in stuck:
                    _remove_placement_group(i)
                return


def _placement_reason(groups: list[dict[str, Any]], timeout_s: float) -> str:
    import ray

    wanted = "; ".join(f"{pg['name'] or pg['placement_group_id'][:8]}: "
                       f"{len(pg['bundles'])} bundle(s) of "
                       f"{_resources(next(iter(pg['bundles'].values())))} on one node "
                       f"({pg['strategy']}; Ray: {pg['stats']['scheduling_state']})"
                       for pg in groups)
    nodes = ", ".join(f"{node_label(n)} has {_resources(n['Resources'])}"
                      for n in ray.nodes() if n.get("Alive"))
    return (f"verl's workers were not placed on the Ray cluster within {timeout_s:g} s "
            f"(train.ray_placement_timeout_s): {wanted}. The cluster has "
            f"{_resources(ray.available_resources())} free; {nodes}. Free the GPUs (`ray "
            "status` lists what holds them) or give each node more CPUs (`ray start "
            "--num-cpus`) for verl's workers beside its TaskRunner and TransferQueue actors.")


def _resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{resources[k]:g} {k}" for k in ("GPU", "CPU") if k in resources) or "none"


def _remove_placement_group(hex_id: str) -> None:
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    # verl's ray.get(pg.ready()) ends with TaskPlacementGroupRemoved, which run_ppo raises.
    ray.util.remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(hex_id)))


def worker_placement() -> list[dict[str, Any]]:
    """Where verl placed this job's ranks on the connected Ray cluster: rank, node (as
    :func:`~rl_pipeline.engines.verl.cluster.node_label` names it) and the actor's name, in
    rank order; empty when Ray's state API does not answer."""
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes()}
    placed = []
    for actor in _gpu_workers():
        # verl names a worker <prefix><class>_<placement group>:<local rank> (ray/base.py),
        # its rank counted over placement groups of RAY_LOCAL_WORLD_SIZE bundles each.
        match = re.search(r"_(\d+):(\d+)$", actor.name or "")
        if match:
            placed.append({"group": int(match[1]), "local_rank": int(match[2]),
                           "node": node_label(nodes[actor.node_id]) if actor.node_id in nodes
                           else actor.node_id, "actor": actor.name})
    per_group = max((p["local_rank"] for p in placed), default=-1) + 1
    for p in placed:
        p["rank"] = p.pop("group") * per_group + p.pop("local_rank")
    return sorted(placed, key=lambda p: p["rank"])


def _gpu_workers_by_node() -> dict[str, int]:
    """Node id -> how many of this job's actors that asked for GPUs (verl's workers) ran
    there; empty when Ray's state API is not served (a cluster started without its
    dashboard)."""
    placed: dict[str, int] = {}
    for actor in _gpu_workers():
        placed[actor.node_id] = placed.get(actor.node_id, 0) + 1
    return placed


def _gpu_workers() -> list[Any]:
    """This job's actors that asked for GPUs (verl's workers) and were placed on a node."""
    import ray

    try:
        from ray.util.state import list_actors

        job = ray.get_runtime_context().get_job_id()
        actors = list_actors(filters=[("job_id", "=", job)], detail=True, limit=10_000,
                             raise_on_missing_output=False, timeout=30)
    except Exception as exc:  # noqa: BLE001 - the placement is extra detail, never the error
        logger.info("Ray's state API did not answer (%s): worker placement not reported", exc)
        return []
    # In a placement group Ray renames the resource: GPU_group_<bundle>_<group id>.
    return [a for a in actors if a.node_id and any(
        k == "GPU" or k.startswith("GPU_group_") for k in a.required_resources or {})]
