"""`kedro run --env multinode` on a Ray cluster of two nodes on this machine: where a GPU run
stops without GPUs, and a whole run of verl's CPU mode, one rank on each node.

The test bed: a real Ray cluster (head and one more node, each declaring one GPU it does not
have, each with vLLM importable as a GPU node has it: the parser folder of `make
vllm-parser`), a real MLflow tracking server, and a copy of the project whose conf/multinode
is shrunk to one GPU per node and a tiny model. The preflight pipeline checks every node and
names each missing device; the train pipeline then gets through verl's own driver, which
places its workers on both nodes, and stops where they initialise their devices, with a
message naming both nodes instead of a worker's NCCL traceback. With ``train.verl.device=cpu``
the same cluster trains: a rank on each node, gloo between them, both ranks writing their
checkpoint shards to the shared folder; the driver SIGKILLed after step 1, the rerun resumes
at step 2, and the two-shard checkpoint merges and is evaluated.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from rl_pipeline.engines.verl.vllm_args import parser_path, vllm_source
from tests.conftest import read_gsm8k, write_jsonl
from tests.projects import kedro_command, make_project, run_env

pytestmark = [pytest.mark.gpu_boundary, pytest.mark.slow]

# verl's CPU mode on the same cluster (the nodes' declared GPUs are its logical ones): short
# responses from the tiny model, a checkpoint every step, eval on this CPU on purpose.
CPU_MODE = ("train.verl.device=cpu,train.verl.actor_fsdp_config_offload_policy=false,"
            "train.verl.rollout_dtype=float32,train.verl.rollout_n=4,"
            "train.verl.rollout_log_prob_micro_batch_size_per_gpu=4,"
            "train.verl.ref_log_prob_micro_batch_size_per_gpu=4,"
            "train.verl.total_training_steps=2,train.verl.trainer_save_freq=1,"
            "data.data_max_response_length=24,eval.backend=hf,eval.max_prompts=4")

# conf/multinode shrunk to the test bed: 1 "GPU" per node, batches a tiny model can take.
TEST_BED = {"train": {"verl": {
    "trainer_n_gpus_per_node": 1, "rollout_tensor_model_parallel_size": 1,
    "data_train_batch_size": 8, "actor_ppo_mini_batch_size": 8,
    "actor_rft_mini_batch_size": 8, "actor_ppo_micro_batch_size_per_gpu": 4,
    "actor_rft_micro_batch_size_per_gpu": 4,
    # verl's default TransferQueue (8 storage actors) is more than 2 cores start quickly.
    "overrides": ["transfer_queue.backend.SimpleStorage.num_data_storage_units=1"]}}}
TRAIN_STOPS_WITHIN_S = 300


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes, one GPU declared on each; shut down whatever the tests do."""
    from ray.cluster_utils import Cluster

    assert vllm_source() not in (None, "installed"), "run `make vllm-parser`"
    cluster = Cluster()
    try:
        with pytest.MonkeyPatch.context() as env:  # the nodes' workers inherit it
            env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [
                str(parser_path()), os.environ.get("PYTHONPATH")])))
            # The head serves Ray's state API (its dashboard), as `ray start --head` does.
            # verl's worker bundle asks 3 CPUs beside its TaskRunner and TransferQueue actors,
            # which Ray may put on either node: 8 logical CPUs each, as a GPU node has more.
            # On a port of its own: Ray's default (8265) may still be held by a dashboard
            # another module's cluster is shutting down.
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                dashboard_port = s.getsockname()[1]
            cluster.add_node(num_cpus=8, num_gpus=1, include_dashboard=True,
                             dashboard_port=dashboard_port)
            cluster.add_node(num_cpus=8, num_gpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory) -> str:
    """A real MLflow server (a SQLite store behind it), as a cluster run needs."""
    folder = tmp_path_factory.mktemp("mlflow_server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db"],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no MLflow server"
                time.sleep(0.5)
        yield uri
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir) -> Path:
    """The project, conf/multinode shrunk to the test bed; data/ is the shared root."""
    root = tmp_path_factory.mktemp("cluster_run")
    project = make_project(root)
    # make_project points the resolved models at the session's cache, outside data/: here
    # they go back under data/, the shared root (one folder overridden, as a user would).
    (project / "conf/multinode/globals.yml").write_text(
        "folders:\n  resolved_models: data/06_models/resolved\n")
    params = project / "conf/multinode/parameters.yml"
    merged = yaml.safe_load(params.read_text())
    merged["train"]["verl"].update(TEST_BED["train"]["verl"])
    params.write_text(yaml.safe_dump(merged))
    raw = root / "raw"
    raw.mkdir()
    write_jsonl(raw / "train.jsonl", read_gsm8k(n=40))
    write_jsonl(raw / "test.jsonl", read_gsm8k(n=10))
    (project / "params.txt").write_text(
        f"base_model={tiny_model_dir},dataset_train_split={raw / 'train.jsonl'},"
        f"dataset_validation_split={raw / 'test.jsonl'}")
    return project


def _run(project: Path, pipeline: str, cluster, tracking_server: str, *params: str,
         timeout: float = 600) -> subprocess.CompletedProcess:
    command = kedro_command("--pipelines", pipeline, "--params", ",".join(
        [(project / "params.txt").read_text(), *params]), env="multinode")
    try:
        return subprocess.run(command, cwd=project, capture_output=True, text=True,
                              timeout=timeout, env=run_env(RAY_ADDRESS=cluster.address,
                                                           MLFLOW_TRACKING_URI=tracking_server))
    except subprocess.TimeoutExpired as hung:
        output = (hung.stdout or b"").decode() + (hung.stderr or b"").decode()
        pytest.fail(f"`kedro run --pipelines {pipeline}` still ran after {timeout:g} s:\n"
                    f"{output[-8000:]}")


@pytest.fixture(scope="module")
def prepared(project, cluster, tracking_server) -> Path:
    result = _run(project, "data_prep", cluster, tracking_server)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return project


def _node_ids(cluster) -> list[str]:
    return [node.node_id[:8] for node in cluster.list_all_nodes()]


def test_preflight_checks_every_node_of_the_cluster(prepared, cluster, tracking_server) -> None:
    # Asking for 2 GPUs per node where each declares 1: the cluster's GPUs are what counts.
    result = _run(prepared, "preflight", cluster, tracking_server,
                  "train.verl.trainer_n_gpus_per_node=2")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert ("train.verl.trainer_n_gpus_per_node=2: at most the cluster's GPUs: 2 x 2 nodes "
            "needs 4, the cluster at auto has 2") in output, output[-5000:]
    assert "Ray cluster at auto, 2 node(s)" in output, output[-5000:]
    for node_id in _node_ids(cluster):
        # Listed in the per-node report, and named in a problem of its own.
        assert f"({node_id})" in output.split("Ray cluster at auto")[1]
        assert f"({node_id}): Ray declares 1 GPU(s) there and torch sees 0" in output
    assert output.count("no CUDA device on node") >= 2
    # Everything else holds on both nodes: vLLM, the package, the reward, the shared paths.
    assert "importable on this node" not in output and "readable at" not in output
    assert "verl needs" not in output  # the driver's own GPUs do not matter on a cluster


def test_train_reaches_verls_workers_on_both_nodes_and_names_them(prepared, cluster,
                                                                  tracking_server) -> None:
    started = time.monotonic()
    result = _run(prepared, "train", cluster, tracking_server, timeout=TRAIN_STOPS_WITHIN_S)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert seconds < TRAIN_STOPS_WITHIN_S, seconds
    assert "verl's workers stopped at device initialisation" in output, output[-5000:]
    message = output.split("verl's workers stopped at device initialisation")[-1]
    assert "verl placed its GPU workers on 2 node(s)" in message
    for node_id in _node_ids(cluster):
        assert f"({node_id}): Ray declares 1 GPU(s) there and torch sees 0" in message
        assert f"({node_id}) (1 worker(s))" in message
    assert "NCCL" in output  # verl's own error, chained below ours
    client = mlflow.MlflowClient(tracking_uri=tracking_server)
    runs = client.search_runs([client.get_experiment_by_name("rl_pipeline").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs}["train"] == "FAILED"


def _newest(project: Path) -> int:
    markers = list(project.glob("data/06_models/train_checkpoints/*/"
                                "latest_checkpointed_iteration.txt"))
    return max((int(m.read_text().strip() or 0) for m in markers), default=0)


def test_cpu_mode_trains_a_rank_on_each_node_resumes_after_a_kill_merges_and_evaluates(
        prepared, cluster, tracking_server) -> None:
    command = kedro_command("--pipelines", "train", "--params", ",".join(
        [(prepared / "params.txt").read_text(), CPU_MODE]), env="multinode")
    env = run_env(RAY_ADDRESS=cluster.address, MLFLOW_TRACKING_URI=tracking_server)
    log = prepared / "killed_train.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, cwd=prepared, stdout=out, stderr=subprocess.STDOUT,
                                  env=env)
        deadline = time.monotonic() + 600
        while _newest(prepared) < 1 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert driver.poll() is None, log.read_text()[-5000:]
        driver.kill()  # SIGKILL, the driver alone: the cluster outlives it, as it would
        driver.wait()
    first = log.read_text()
    # The preflight checked every node, then joined them in one all-reduce over gloo.
    assert "Ray cluster at auto, 2 node(s)" in first, first[-5000:]
    assert "2 node(s) joined a gloo all-reduce" in first, first[-5000:]
    assert _newest(prepared) == 1

    # The rerun resumes, then merges and evaluates in the same kedro run (a kedro start, a
    # Ray connection and the cluster checks each cost seconds on this machine's 2 cores).
    result = _run(prepared, "train,merge,eval", cluster, tracking_server, CPU_MODE)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    summary = yaml.safe_load((prepared / "data/08_reporting/train_summary.json").read_text())
    assert (summary["resumed_from_step"], summary["steps"]) == (1, 2), summary
    # A rank on each node (verl's placement over the two nodes' one "GPU" each).
    placement = summary["placement"]
    print("placement:", placement, "| resumed from step", summary["resumed_from_step"])  # noqa: T201
    assert [p["rank"] for p in placement] == [0, 1], placement
    assert sorted(p["node"].split("(")[1][:8] for p in placement) == sorted(_node_ids(cluster))
    # This run's folder (the GPU run above made one of its own, for another identity).
    (marker,) = prepared.glob("data/06_models/train_checkpoints/*/"
                              "latest_checkpointed_iteration.txt")
    folder = marker.parent
    for step in (1, 2):  # both ranks wrote their shard, step 1 before the kill, 2 after
        shards = {p.name: p.stat().st_size for p in (folder / f"global_step_{step}/actor")
                  .glob("model_world_size_*")}
        print(f"step {step} shards:", shards)  # noqa: T201
        assert set(shards) == {"model_world_size_2_rank_0.pt",
                               "model_world_size_2_rank_1.pt"}, step

    (metadata,) = prepared.glob("data/06_models/merged_model/*/merged_model/merge_metadata.json")
    merge = yaml.safe_load(metadata.read_text())
    assert merge["verification"]["passed"] and merge["training_run"]["steps"] == 2
    print("merge verification:", merge["verification"])  # noqa: T201
    metrics = yaml.safe_load((prepared / "data/08_reporting/eval_metrics.json").read_text())
    assert metrics["base"]["prompts"] == metrics["trained"]["prompts"] == 4
