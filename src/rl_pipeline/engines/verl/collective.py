"""A bounded all-reduce across the Ray cluster's nodes before verl starts.

verl's workers form their process group with torch's default timeout: a node that cannot
reach the others (a blocked port, the wrong network interface, a missing device) leaves the
run waiting 10 minutes, then fails with a collective timeout that names no node (multi-node
hang reports: verl #3873, #2995, #1309). Here every node joins one small all-reduce, gloo on
CPUs or NCCL on GPUs, with a timeout of seconds, and a failure names the node, the interface
it used and the variables that choose it.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import time
from typing import Any

from rl_pipeline.engines.problems import Problem

# The driver waits this much beyond the collective's own timeout: the tasks start workers and
# import torch before they join, and a TCPStore client retries its connection once.
MARGIN_S = 10.0
SETTINGS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR")
IFNAME = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
_HINT = {
    "gloo": "GLOO_SOCKET_IFNAME chooses the interface gloo uses",
    "nccl": "NCCL_SOCKET_IFNAME chooses the interface NCCL uses (NCCL_IB_DISABLE=1 where "
            "InfiniBand is not wired; NCCL_DEBUG=INFO logs what NCCL picks)",
}


def check_collective(nodes: list[dict[str, Any]], *, backend: str,
                     timeout_s: float) -> tuple[list[Problem], dict[str, Any]]:
    """Join every node of ``nodes`` (``ray.nodes()`` entries; Ray initialised by the caller)
    in one all-reduce on ``backend``, rank 0 on the first node, which hosts the rendezvous.

    Returns within about ``timeout_s`` + :data:`MARGIN_S` seconds: the problems (empty when
    every node summed the world size) and a report of the check, per node.
    """
    started = time.monotonic()
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Imported here, not above: the tasks import this module on every node, and cluster
    # pulls in verl, seconds of imports in each fresh worker for a label the driver makes.
    from rl_pipeline.engines.verl.cluster import node_label

    def pinned(node: dict[str, Any]) -> NodeAffinitySchedulingStrategy:
        return NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)

    deadline = started + timeout_s + MARGIN_S
    host, world = nodes[0]["NodeManagerAddress"], len(nodes)
    labels = [node_label(node) for node in nodes]
    results: dict[int, dict[str, Any]] = {}
    # The port must be free where rank 0 listens, which is not where this driver runs.
    port_ref = ray.remote(num_cpus=0)(_free_port).options(
        scheduling_strategy=pinned(nodes[0])).remote()
    try:
        port = ray.get(port_ref, timeout=timeout_s + MARGIN_S)
    except Exception as exc:  # reported as node 0's problem
        ray.cancel(port_ref, force=True)
        port, results[0] = 0, _failed(0, f"no free port found there: {exc}", started)
    refs: dict[Any, int] = {}
    if port:
        # max_calls=1: the worker that joined a process group exits after it, so that a
        # failed or half-made group never lingers in a worker Ray would reuse.
        join = ray.remote(num_cpus=0, num_gpus=1 if backend == "nccl" else 0,
                          max_calls=1)(_join)
        refs = {join.options(scheduling_strategy=pinned(node)).remote(
            backend, host, port, rank, world, timeout_s): rank
            for rank, node in enumerate(nodes)}
    pending = list(refs)
    while pending and all(r["ok"] for r in results.values()):
        done, pending = ray.wait(pending, num_returns=1,
                                 timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            break
        for ref in done:
            try:
                results[refs[ref]] = ray.get(ref)
            except Exception as exc:  # a worker that died: its node's problem
                asked = " (it asks the node for 1 GPU)" if backend == "nccl" else ""
                results[refs[ref]] = _failed(refs[ref], f"the task failed{asked}: {exc}",
                                             started)
    # One failure dooms the collective; the others would only wait out their timeout.
    for ref in pending:
        ray.cancel(ref, force=True)
    silent = sorted(refs[ref] for ref in pending)
    raised = sorted(rank for rank, r in results.items() if not r["ok"])
    # Rank 0's store gives up waiting for ranks that never came: those are the ones to name.
    if silent and raised == [0] and "DistStoreError" in (results[0]["error"] or ""):
        raised = []
    address = f"{host}:{port}"
    problems = [Problem("node", labels[rank], _message(
        labels[rank], backend, world, address, results[rank]), group="cluster")
        for rank in raised] or [Problem("node", labels[rank], _silent(
            labels[rank], backend, world, address, timeout_s, results.get(0)), group="cluster")
        for rank in silent]
    report = {"backend": backend, "world_size": world, "rendezvous": address,
              "seconds": round(time.monotonic() - started, 1), "ok": not problems,
              "nodes": [{"node": labels[rank], "rank": rank, "ok": False, "seconds": None,
                         "error": "no answer", **results.get(rank, {})}
                        for rank in range(world)]}
    return problems, report


def _message(label: str, backend: str, world: int, address: str, result: dict[str, Any]) -> str:
    ifname = result.get(IFNAME[backend])
    interface = (f"the interface {ifname} ({IFNAME[backend]})" if ifname else
                 f"the interface chosen by {backend} from the host name {result['hostname']}"
                 if result.get("hostname") else "an interface not known (the task did not run)")
    error = _first_line(result["error"])
    return (f"node {label} failed to join the {backend} all-reduce of {world} nodes at "
            f"{address} after {result['seconds']:.1f} s, on {interface}: {error}. "
            f"{_HINT[backend]}; set it, on every node before `ray start`, to the interface "
            "that reaches the other nodes")


def _silent(label: str, backend: str, world: int, address: str, timeout_s: float,
            rank0: dict[str, Any] | None) -> str:
    waited = (f" (rank 0 gave up waiting: {_first_line(rank0['error'])})"
              if rank0 and rank0["error"] else "")
    return (f"node {label} did not join the {backend} all-reduce of {world} nodes at {address} "
            f"within {timeout_s:g} s{waited}: its interface is unknown, as the node did not "
            f"answer. {_HINT[backend]}; set it, on every node before `ray start`, to the "
            "interface that reaches the other nodes, and open the port to them")


def _first_line(error: str | None) -> str:
    # gloo prefixes its errors with the C++ source line that raised them, of no use here.
    line = next(iter((error or "").strip().splitlines()), "")
    return re.sub(r"\[enforce fail at [^\]]*\] ", "", line)[:300]


def _failed(rank: int, error: str, started: float) -> dict[str, Any]:
    return {"rank": rank, "ok": False, "error": error,
            "seconds": round(time.monotonic() - started, 1)}


def _free_port() -> int:
    """On rank 0's node: a TCP port nothing listens on (until the rendezvous takes it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _join(backend: str, host: str, port: int, rank: int, world: int,
          timeout_s: float) -> dict[str, Any]:
    """On one node: join the group, sum a one, leave; whatever fails is reported, not raised."""
    import torch
    import torch.distributed as dist

    started = time.monotonic()
    seen = {name: os.environ.get(name) for name in SETTINGS}
    error = None
    try:
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            ones = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
            dist.all_reduce(ones)
            if ones.item() != world:
                error = f"the all-reduce summed to {ones.item():g}, not {world}"
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # the message for the driver to report
        error = f"{type(exc).__name__}: {exc}"
    return {"rank": rank, "ok": error is None, "error": error,
            "seconds": round(time.monotonic() - started, 1), **seen,
            "hostname": socket.gethostname()}
