"""Checks for a verl run on a Ray cluster: shared storage, tracking the workers can reach, our
code on every node, and a check task on each node before verl starts.

A run on several nodes reads the prompts, the base model and a custom reward file, and
writes checkpoints, from every node; verl's MLflow logger runs on a worker. On one machine
all of that works by accident (local paths, a SQLite store, the package installed where the
driver runs); on a cluster each of these fails late, or silently (verl drops the MLflow
start-up error, so the per-step metrics are just missing).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rl_pipeline
from rl_pipeline.engines.verl_preflight import Hardware, Problem

# Free space a node needs for checkpoints (an FSDP checkpoint of a 0.5B model with its
# optimizer state is about 6 GB; a LoRA one much less).
MIN_FREE_GB = 10.0
_LOCAL_STORES = ("sqlite:", "file:")


@dataclass(frozen=True)
class WorkerPaths:
    """What the workers read and write, by the catalog entry or parameter that sets it."""

    train_prompts: str
    val_prompts: str
    base_model: str
    train_checkpoints: str
    reward_file: str | None = None

    def items(self) -> list[tuple[str, str, str]]:
        """(group, name, path) of each path, the reward file last when there is one."""
        out = [("catalog", "train_prompts", self.train_prompts),
               ("catalog", "val_prompts", self.val_prompts),
               ("catalog", "base_model", self.base_model),
               ("catalog", "train_checkpoints", self.train_checkpoints)]
        if self.reward_file:
            out.append(("reward.custom_reward_function", "path", self.reward_file))
        return out


def on_cluster(hardware: Hardware, ray_address: str | None) -> bool:
    """Whether the workers may run on other machines than the driver."""
    return hardware.nnodes > 1 or bool(ray_address)


def check_storage(paths: WorkerPaths, shared_root: str | None) -> list[Problem]:
    """Every path the workers use must lie under ``train.shared_root``, files followed through
    symlinks (a resolved model folder links into the driver's Hugging Face cache)."""
    if not shared_root:
        return [Problem("shared_root", None, "a folder every node mounts at the same path "
                        "(NFS, Lustre, ...), required on a Ray cluster: the workers read the "
                        "prompts and the model and write checkpoints there", group="train")]
    root = Path(shared_root).resolve()
    problems = []
    for group, name, path in paths.items():
        outside = [p for p in _real_paths(Path(path)) if not p.is_relative_to(root)]
        if outside:
            problems.append(Problem(name, path, f"a path under train.shared_root ({root}) that "
                                    f"every node sees; {outside[0]} is outside it" +
                                    (" (set link_files: false on base_model to copy the "
                                     "files instead of linking them)" if name == "base_model"
                                     else ""), group=group))
    return problems


def check_tracking(tracking_uri: str | None) -> list[Problem]:
    """verl's MLflow logger runs on a worker: a store on the driver's disk is out of its reach."""
    if tracking_uri and not tracking_uri.startswith(_LOCAL_STORES) and "://" in tracking_uri:
        return []
    return [Problem("mlflow_tracking_uri", tracking_uri, "a tracking server every node "
                    "reaches (http://host:5000): workers on other nodes cannot write to a "
                    "SQLite or file store on the driver, and verl drops the error, so the "
                    "per-step metrics would be lost. Set server.mlflow_tracking_uri in "
                    "conf/<env>/mlflow.yml (conf/local/README.md)", group="mlflow")]


def package_runtime_env() -> dict[str, Any]:
    """Ship this package to every node (verl imports the reward as ``pkg://rl_pipeline...``)."""
    return {"py_modules": [str(Path(rl_pipeline.__file__).parent)]}


def check_nodes(address: str, hardware: Hardware, paths: WorkerPaths,
                report: dict[str, Any]) -> list[Problem]:
    """Run a check task on every node of the cluster at ``address``; report per node.

    Each task (pinned to its node) checks that our package and vLLM import, the input paths
    are readable, the checkpoint folder's disk has room, and the GPUs Ray declares are CUDA
    devices torch can see. The cluster must offer ``hardware.gpus`` GPUs.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, runtime_env=package_runtime_env(), log_to_driver=False)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        task = ray.remote(num_cpus=0)(_node_check)
        futures = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                       n["NodeID"], soft=False)).remote(paths, n["Resources"].get("GPU", 0))
                   for n in nodes]
        results = ray.get(futures, timeout=300)
        total_gpus = ray.cluster_resources().get("GPU", 0)
    finally:
        if started:
            ray.shutdown()
    report["cluster"] = {"address": address, "gpus": total_gpus, "nodes": results}
    problems = []
    if total_gpus < hardware.gpus:
        problems.append(Problem("trainer_n_gpus_per_node", hardware.gpus_per_node,
                                f"at most the cluster's GPUs: {hardware.gpus_per_node} x "
                                f"{hardware.nnodes} nodes needs {hardware.gpus}, the cluster "
                                f"at {address} has {total_gpus:g}"))
    for node in results:
        problems += [Problem("node", node["ip"], problem, group="cluster")
                     for problem in node["problems"]]
    return problems


def _node_check(paths: WorkerPaths, declared_gpus: float) -> dict[str, Any]:
    """On one node: everything a verl worker there will need."""
    import importlib.util
    import shutil
    import socket

    import ray

    problems = []
    for module in ("rl_pipeline", "vllm"):
        if importlib.util.find_spec(module) is None:
            problems.append(f"{module} importable on this node (it is not)")
    for _, name, path in paths.items():
        if name != "train_checkpoints" and not os.access(path, os.R_OK):
            problems.append(f"{name} readable at {path} on this node (it is not)")
    checkpoints = Path(paths.train_checkpoints)
    existing = next((p for p in (checkpoints, *checkpoints.parents) if p.exists()), None)
    free_gb = shutil.disk_usage(existing).free / 1e9 if existing else 0.0
    if free_gb < MIN_FREE_GB:
        problems.append(f"at least {MIN_FREE_GB:g} GB free for train_checkpoints at "
                        f"{checkpoints} ({free_gb:.1f} GB)")
    try:
        import torch

        cuda = torch.cuda.device_count()
    except ImportError:
        cuda = 0
    if declared_gpus and cuda < declared_gpus:
        problems.append(f"{declared_gpus:g} CUDA device(s), as Ray declares for this node: "
                        f"torch sees {cuda} (no CUDA device on node {socket.gethostname()})")
    return {"ip": ray.util.get_node_ip_address(), "host": socket.gethostname(),
            "declared_gpus": declared_gpus, "cuda_devices": cuda, "free_gb": round(free_gb, 1),
            "problems": problems}


def _real_paths(path: Path) -> list[Path]:
    """``path`` and, for a folder, every file in it, with symlinks followed."""
    out = [path.resolve()]
    if path.is_dir():
        out += [p.resolve() for p in path.rglob("*") if p.is_file() or p.is_symlink()]
    return out
