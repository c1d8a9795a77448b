"""verl on a Ray cluster: shared storage, tracking the workers can reach, our code on every
node, and a check task on each node before verl starts.

A run on several nodes reads the prompts and the base model, and writes checkpoints, from
every node; verl's MLflow logger runs on a worker. On one machine all of that works by
accident (local paths, a SQLite store, the package installed where the driver runs); on a
cluster each of these fails late, or silently (verl drops the MLflow start-up error, so the
per-step metrics are just missing).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rl_pipeline
from rl_pipeline.engines.problems import Problem
from rl_pipeline.engines.verl.host import driver_problem, driver_version, free_gib
from rl_pipeline.engines.verl.preflight import HF_ROLLOUT, Hardware
from rl_pipeline.engines.verl.stop_signals import StopHandlers
from rl_pipeline.rewards.scoring import PKG
from rl_pipeline.tracking.stores import is_local_store, uri_credentials

logger = logging.getLogger(__name__)

# How long a cluster may take to answer: an address nobody listens on makes ray.init retry
# for minutes, so the address is probed first; a node's check task imports torch.
CONNECT_TIMEOUT_S = 5.0
TASK_TIMEOUT_S = 300.0
# The collective check's bound (collective.check_collective): a process group of a few
# nodes forms in seconds; verl's own waits 10 minutes for a node it cannot reach.
COLLECTIVE_TIMEOUT_S = 60.0
_HOST_PORT = re.compile(r"^(?:ray://)?\[?(?P<host>[^\]/]+?)\]?:(?P<port>\d+)$")


@dataclass(frozen=True)
class WorkerPaths:
    """What the workers read and write, by the catalog entry that sets it."""

    train_prompts: str
    val_prompts: str
    base_model: str
    train_checkpoints: str

    def items(self) -> list[tuple[str, str]]:
        return list(vars(self).items())


@dataclass(frozen=True)
class RewardTarget:
    """The ``reward`` group's function: a file (shipped to the nodes) or a built-in."""

    path: str | None
    name: str

    @property
    def on_workers(self) -> str | None:
        """Where the workers import it from: a shipped file is a module of its own there."""
        return f"{PKG}{Path(self.path).stem}" if self.path else None


def on_cluster(hardware: Hardware, ray_address: str | None) -> bool:
    """Whether the workers may run on other machines than the driver."""
    return hardware.nnodes > 1 or bool(ray_address)


def shipped_modules(reward: RewardTarget) -> list[str]:
    """What Ray's runtime_env ``py_modules`` carries to every node: this package (verl imports
    the reward entry as ``pkg://rl_pipeline...``) and the custom reward file, if any."""
    return [str(Path(rl_pipeline.__file__).parent),
            *([str(Path(reward.path).resolve())] if reward.path else [])]


def check_shipped_reward(reward: RewardTarget) -> list[Problem]:
    """A shipped reward file becomes a top-level module on the nodes: its name must be one,
    and must not shadow (or be shadowed by) a module that is already importable."""
    if not reward.path:
        return []
    import importlib.util

    stem = Path(reward.path).stem
    if not stem.isidentifier():
        return [Problem("path", reward.path, "a file named as a Python module (letters, "
                        "digits and _), as it is shipped to the nodes and imported as "
                        f"{stem!r} there", group="reward.custom_reward_function")]
    found = importlib.util.find_spec(stem)
    if found is not None and Path(found.origin or "").resolve() != Path(reward.path).resolve():
        return [Problem("path", reward.path, f"a file whose name is no other module's: it is "
                        f"imported as {stem!r} on the nodes, which is {found.origin}; rename "
                        "the file", group="reward.custom_reward_function")]
    return []


def check_storage(paths: WorkerPaths, shared_root: str | None) -> list[Problem]:
    """Every path the workers use must lie under ``train.shared_root``, files followed through
    symlinks (a resolved model folder links into the driver's Hugging Face cache)."""
    if not shared_root:
        return [Problem("shared_root", None, "a folder every node mounts at the same path "
                        "(NFS, Lustre, ...), required on a Ray cluster: the workers read the "
                        "prompts and the model and write checkpoints there", group="train")]
    root = Path(shared_root).resolve()
    problems = []
    for name, path in paths.items():
        outside = [p for p in _real_paths(Path(path)) if not p.is_relative_to(root)]
        if outside:
            problems.append(Problem(name, path, f"a path under train.shared_root ({root}) that "
                                    f"every node sees; {outside[0]} is outside it" +
                                    (" (set link_files: false on base_model to copy the "
                                     "files instead of linking them)" if name == "base_model"
                                     else ""), group="catalog"))
    return problems


def check_tracking(tracking_uri: str | None) -> list[Problem]:
    """verl's MLflow logger runs on a worker: a store on the driver's disk is out of its reach."""
    if not is_local_store(tracking_uri):
        return []
    return [Problem("mlflow_tracking_uri", tracking_uri, "a tracking server every node "
                    "reaches (http://host:5000): workers on other nodes cannot write to a "
                    "SQLite or file store on the driver, and verl drops the error, so the "
                    "per-step metrics would be lost. Set server.mlflow_tracking_uri in "
                    "conf/<env>/mlflow.yml (conf/local/README.md)", group="mlflow")]


def check_tracking_credentials(tracking_uri: str | None) -> list[Problem]:
    """No user name, password or token in the tracking URI: verl logs its whole
    configuration as MLflow parameters of the run, the workers' environment (where the URI
    travels) included. (For a server, :class:`rl_pipeline.hooks.TypedParamsMlflowHook`
    refuses it for every stage first; a database URI's password reaches verl's check.)"""
    shown = uri_credentials(tracking_uri)
    if shown is None:
        return []
    return [Problem("mlflow_tracking_uri", shown, "a URI without credentials: verl logs its "
                    "configuration, the Ray workers' environment with this URI in it, as "
                    "parameters of the train run, so the secret would be stored in MLflow. "
                    "Give them as MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                    "MLFLOW_TRACKING_TOKEN) in the environment of kedro run (a local Ray's "
                    "workers inherit it; on a cluster set them on every node)",
                    group="mlflow")]


def check_nodes(address: str, hardware: Hardware, paths: WorkerPaths, reward: RewardTarget,
                report: dict[str, Any], *, training: bool, attention: str = "sdpa",
                rollout: str = "vllm") -> list[Problem]:
    """Run a check task on every node of the cluster at ``address``; report per node.

    Each task (pinned to its node, shipped our code as verl's workers will be) checks that our
    package, the reward function, the ``rollout`` engine (none for ``hf``, the transformers
    rollout) and the ``attention`` kernel import, the input paths
    are readable, the checkpoint folder is the same storage as on the other nodes (a file
    one node writes there, every node reads), the NVIDIA driver is new enough, and the GPUs
    Ray declares are CUDA devices torch sees; it reports the free disk there, which the
    preflight checks against the kept checkpoints. The cluster must offer ``hardware.gpus``
    GPUs (logical ones on CPUs: ``ray start --num-gpus``). Then every node joins one
    all-reduce, NCCL on GPUs or gloo on CPUs, bounded by :data:`COLLECTIVE_TIMEOUT_S`
    (:func:`~rl_pipeline.engines.verl.collective.check_collective`): a node the others
    cannot reach is named in seconds, with the interface and the variables that choose it.

    Only checking (``training=False``), a node whose declared GPUs torch does not see is a
    problem, and a cluster that cannot be reached is reported and skipped (the configuration
    can be checked on any machine). Before training, the cluster must answer; a node's
    missing CUDA devices are a warning, and the verdict is verl's: its workers, which hold
    the GPUs Ray assigns them, fail at device initialisation within a minute of the start,
    before any model is loaded, and
    :func:`~rl_pipeline.engines.verl.failures.explain_worker_failure` names the node.
    """
    import ray

    unreachable = _unreachable(address)
    started = not ray.is_initialized()
    handlers = StopHandlers()
    if started and not unreachable:
        try:
            ray.init(address=address, log_to_driver=False,
                     runtime_env={"py_modules": shipped_modules(reward)})
        except ConnectionError as exc:
            unreachable = str(exc)
        finally:  # ray.init installs Ray's SIGTERM handler first, even where it then fails
            handlers.restore()
    if unreachable:
        report["cluster"] = {"address": address, "checked": False, "reason": unreachable}
        if training:
            return [Problem("ray_address", address, f"a running Ray cluster: {unreachable}",
                            group="train")]
        logger.warning("preflight: the Ray cluster at %r was not checked (%s); the train "
                       "pipeline checks every node before verl starts", address, unreachable)
        return []
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        # One node writes a token where the checkpoints go; every node must read it back.
        token = f"{uuid.uuid4().hex}\n"
        marker = str(Path(paths.train_checkpoints) / f".shared-storage-check-{token[:12]}")
        written, made = on_each_node(nodes[:1], _write_marker, marker, token)[0]
        try:
            results = on_each_node(nodes, _node_check, paths, reward.on_workers, reward.name,
                                   attention, marker if written is None else None, token,
                                   rollout)
        finally:
            on_each_node(nodes[:1], _remove_marker, marker, made)
        for node, result in zip(nodes, results, strict=True):
            result.update(node=node_label(node), declared_gpus=node["Resources"].get("GPU", 0))
        collective_problems = _join_collective(nodes, results, hardware, report)
        resources = ray.cluster_resources()
        total_gpus, total_cpus = resources.get("GPU", 0), resources.get("CPU", 0)
    finally:
        if started:
            ray.shutdown()
        handlers.restore()
    report["cluster"] = {"address": address, "checked": True, "gpus": total_gpus,
                         "cpus": total_cpus, "nodes": results}
    _log_nodes(address, results, hardware)
    problems = []
    if total_gpus < hardware.gpus:
        problems.append(Problem("trainer_n_gpus_per_node", hardware.gpus_per_node,
                                f"at most the cluster's GPUs: {hardware.gpus_per_node} x "
                                f"{hardware.nnodes} nodes needs {hardware.gpus}, the cluster "
                                f"at {address} has {total_gpus:g}"))
    for node in results:
        problems += [Problem("node", node["node"], problem, group="cluster")
                     for problem in node["problems"]]
        if _missing_devices(node, hardware):
            missing = no_cuda_device(node["node"], node["declared_gpus"], node["cuda_devices"])
            if training:
                logger.warning("preflight: %s; verl's workers there will stop at device "
                               "initialisation", missing)
            else:
                problems.append(Problem("node", node["node"], missing, group="cluster"))
    return problems + collective_problems


def _missing_devices(node: dict[str, Any], hardware: Hardware) -> bool:
    """Whether a node declares GPUs that torch does not see there (on CPUs they are logical)."""
    return (hardware.device != "cpu" and bool(node["declared_gpus"])
            and node["cuda_devices"] < node["declared_gpus"])


def _join_collective(nodes: list[dict[str, Any]], results: list[dict[str, Any]],
                     hardware: Hardware, report: dict[str, Any]) -> list[Problem]:
    """The nodes verl can place ranks on (those that declare GPUs; a head node without any
    takes no rank) in one bounded all-reduce, where each has its devices (a node without
    them is named already, and NCCL could not start there)."""
    from rl_pipeline.engines.verl.collective import check_collective

    ranked = [(node, result) for node, result in zip(nodes, results, strict=True)
              if result["declared_gpus"] > 0]
    if not ranked or any(_missing_devices(result, hardware) for _, result in ranked):
        report["collective"] = {"checked": False, "reason": "no node declares GPUs" if not
                                ranked else "a node lacks its CUDA devices"}
        return []
    backend = "gloo" if hardware.device == "cpu" else "nccl"
    problems, report["collective"] = check_collective([node for node, _ in ranked],
                                                      backend=backend,
                                                      timeout_s=COLLECTIVE_TIMEOUT_S)
    logger.info("preflight: %d node(s) joined a %s all-reduce in %.1f s%s", len(ranked),
                backend, report["collective"]["seconds"], "" if not problems else
                f"; {len(problems)} did not")
    return problems


def on_each_node(nodes: list[dict[str, Any]], fn: Any, *args: Any) -> list[Any]:
    """``fn(*args)`` as a Ray task pinned to each of ``nodes`` (``ray.nodes()`` entries), the
    results in their order."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(fn)
    return ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node["NodeID"], soft=False)).remote(*args) for node in nodes], timeout=TASK_TIMEOUT_S)


def cuda_devices() -> int:
    """CUDA devices torch sees in this process (0 without a CUDA build)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def no_cuda_device(node: str, declared: float, seen: int) -> str:
    return (f"no CUDA device on node {node}: Ray declares {declared:g} GPU(s) there and "
            f"torch sees {seen}")


def node_label(node: dict[str, Any]) -> str:
    """A node as the messages name it: its address, and its Ray id (two nodes can share an
    address, as on one machine)."""
    return f"{node['NodeManagerAddress']} ({node['NodeID'][:8]})"


def _unreachable(address: str) -> str | None:
    """Why nothing answers at ``address`` (host:port or ray://host:port), or None. ``auto``
    is Ray's to resolve: it fails at once when no cluster runs on this machine."""
    match = _HOST_PORT.match(address)
    if not match:
        return None
    host, port = match["host"], int(match["port"])
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc})"
    return None


def _write_marker(marker: str, token: str) -> tuple[str | None, str | None]:
    """On the first node: write the shared-storage token.

    Returns:
        Why it could not be written (None: written), and the topmost folder made for it (None:
        its folder was there), which :func:`_remove_marker` takes away again, so that a
        check-only preflight leaves no empty checkpoint folder behind.
    """
    folder = Path(marker).parent
    made = next((str(p) for p in reversed([folder, *folder.parents]) if not p.exists()), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        Path(marker).write_text(token)
    except OSError as exc:
        return str(exc), made
    return None, made


def _remove_marker(marker: str, made: str | None) -> None:
    """Remove the token, and the folders :func:`_write_marker` made while still empty."""
    Path(marker).unlink(missing_ok=True)
    if made is None:
        return
    folder = Path(marker).parent
    while True:
        try:
            folder.rmdir()
        except OSError:  # not empty: something else writes there now
            return
        if str(folder) == made:
            return
        folder = folder.parent


def _node_check(paths: WorkerPaths, reward_path: str | None, reward_name: str,
                attention: str = "sdpa", marker: str | None = None, token: str = "",
                rollout: str = "vllm") -> dict[str, Any]:
    """On one node: everything a verl worker there will need."""
    import importlib.util

    import ray

    from rl_pipeline.rewards.scoring import load_reward_function

    problems = []
    modules = ["rl_pipeline", *([] if rollout == HF_ROLLOUT else [rollout])]
    if attention == "flash_attention_2":  # train.verl.actor_model_attn_implementation
        modules.append("flash_attn")
    for module in modules:
        if importlib.util.find_spec(module) is None:
            problems.append(f"{module} importable on this node (it is not)")
    if marker is None:
        problems.append(f"train_checkpoints writable at {paths.train_checkpoints} on the "
                        "first node (it is not)")
    else:
        try:
            same = Path(marker).read_text() == token
        except OSError:
            same = False
        if not same:
            problems.append(f"train_checkpoints at {paths.train_checkpoints} on storage shared "
                            f"with the other nodes: the file {Path(marker).name} that the first "
                            "node wrote there is not here (a node-local folder at the same "
                            "path would split verl's checkpoint shards across nodes)")
    try:
        load_reward_function(reward_path, reward_name)
    except (OSError, ValueError) as exc:
        problems.append(f"the reward function importable on this node: {exc}")
    for name, path in paths.items():
        if name != "train_checkpoints" and not os.access(path, os.R_OK):
            problems.append(f"{name} readable at {path} on this node (it is not)")
    # The space the kept checkpoints need is checked against this once verl's config is
    # composed (engine._check_host).
    free = free_gib(paths.train_checkpoints)
    driver = driver_version()
    if problem := driver_problem(driver, "this node"):
        problems.append(problem)
    return {"ip": ray.util.get_node_ip_address(), "host": socket.gethostname(),
            "cuda_devices": cuda_devices(), "free_gib": round(free, 1),
            "nvidia_driver": driver, "problems": problems}


def _log_nodes(address: str, results: list[dict[str, Any]], hardware: Hardware) -> None:
    lines = []
    for r in results:
        found = list(r["problems"])
        if _missing_devices(r, hardware):
            found.append("no CUDA device")
        lines.append(f"  {r['node']:<28} {r['host']:<20} GPUs declared {r['declared_gpus']:g}, "
                     f"CUDA devices {r['cuda_devices']}, driver {r['nvidia_driver'] or 'none'}, "
                     f"{r['free_gib']:g} GiB free: "
                     + ("; ".join(found) or "ok"))
    logger.info("Ray cluster at %s, %d node(s):\n%s", address, len(results), "\n".join(lines))


def _real_paths(path: Path) -> list[Path]:
    """``path`` and, for a folder, every file in it, with symlinks followed."""
    out = [path.resolve()]
    if path.is_dir():
        out += [p.resolve() for p in path.rglob("*") if p.is_file() or p.is_symlink()]
    return out
