"""verl on a Ray cluster: the shared-storage, tracking and code-shipping checks, and the
per-node check on a real two-node Ray cluster on this machine (GPUs declared, none present)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl.config import LaunchInputs
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.verl_inputs import SMALL, verl_prompts

# Slow: a Ray cluster of two nodes.
pytestmark = pytest.mark.slow

TWO_NODES = {**SMALL, "trainer_nnodes": 2, "trainer_n_gpus_per_node": 1}


@pytest.fixture(scope="module")
def shared(tmp_path_factory, tiny_model_dir) -> Path:
    """A 'shared' root holding real copies of everything the workers use."""
    root = tmp_path_factory.mktemp("shared")
    shutil.copytree(tiny_model_dir, root / "model")
    verl_prompts(root / "train.parquet", 16, "train")
    verl_prompts(root / "val.parquet", 6, "test")
    return root


def _inputs(root: Path, **changes) -> LaunchInputs:
    return LaunchInputs(**{"train_files": str(root / "train.parquet"),
                           "val_files": str(root / "val.parquet"),
                           "model_path": str(root / "model"),
                           "checkpoints_dir": str(root / "checkpoints"),
                           "tracking_uri": "http://mlflow.internal:5000",
                           "ray_address": "ray://head:10001", "shared_root": str(root),
                           **changes})


def _problems(inputs: LaunchInputs, reward: RewardParams | None = None, **verl) -> str:
    with pytest.raises(PreflightError) as failure:
        plan_verl(VerlParams(**{**TWO_NODES, **verl}), DataParams(), reward or RewardParams(),
                  inputs, gpus_visible=0, training=False, train_rows=16)
    return str(failure.value)


def test_a_good_cluster_configuration_passes_and_ships_the_package(shared) -> None:
    plan = plan_verl(VerlParams(**TWO_NODES), DataParams(), RewardParams(), _inputs(shared),
                     gpus_visible=0, training=False, train_rows=16)
    runtime_env = plan.config.ray_kwargs.ray_init.runtime_env
    (module,) = runtime_env.py_modules
    assert Path(module, "rewards", "scoring.py").is_file()  # verl's pkg://rl_pipeline... entry
    assert plan.config.ray_kwargs.ray_init.address == "ray://head:10001"


def test_no_shared_root_is_named(shared) -> None:
    assert "train.shared_root=None: a folder every node mounts" in _problems(
        _inputs(shared, shared_root=None))


def test_paths_outside_the_shared_root_are_named_through_symlinks(shared, tmp_path,
                                                                  tiny_model_dir) -> None:
    linked = tmp_path / "linked_model"  # as a resolved hub model: links to the driver's cache
    linked.mkdir()
    for f in tiny_model_dir.iterdir():
        (linked / f.name).symlink_to(f)
    inside = shared / "linked_model"
    if not inside.exists():
        shutil.copytree(linked, inside, symlinks=True)
    message = _problems(_inputs(shared, model_path=str(inside),
                                checkpoints_dir=str(tmp_path / "ckpt")))
    assert f"catalog.base_model='{inside}': a path under train.shared_root" in message
    assert "link_files: false" in message
    assert f"catalog.train_checkpoints='{tmp_path / 'ckpt'}'" in message


def test_a_custom_reward_file_travels_with_the_job(shared, tmp_path) -> None:
    """The file need not be on the shared storage: it is shipped, and imported by name there."""
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, "
                      "extra_info=None):\n"
                      "    return float(solution_str.endswith('#### ' + ground_truth))\n")
    plan = plan_verl(VerlParams(**TWO_NODES), DataParams(),
                     RewardParams(custom_reward_function={"path": str(reward),
                                                          "name": "compute_score"}),
                     _inputs(shared), gpus_visible=0, training=False, train_rows=16)
    config = plan.config
    assert str(reward) in config.ray_kwargs.ray_init.runtime_env.py_modules
    kwargs = config.reward.custom_reward_function.reward_kwargs
    shipped = RewardParams.model_validate_json(kwargs.reward).custom_reward_function
    assert (shipped.path, shipped.name) == ("pkg://my_reward", "compute_score")
    # Checked on this machine through the file itself: the reward self-test passed.
    assert plan.report["reward"]["openai/gsm8k"]["gold_correct"] == 1.0


@pytest.mark.parametrize(("name", "why"), [("my-reward.py", "a file named as a Python module"),
                                           ("json.py", "a file whose name is no other module's")])
def test_a_reward_file_that_cannot_be_a_module_on_the_nodes_is_named(shared, tmp_path, name,
                                                                     why) -> None:
    reward = tmp_path / name
    reward.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 0.0\n")
    message = _problems(_inputs(shared), RewardParams(custom_reward_function={
        "path": str(reward), "name": "score"}))
    assert f"reward.custom_reward_function.path='{reward}': {why}" in message


@pytest.mark.parametrize("uri", ["sqlite:////tmp/mlflow.db", "file:///tmp/mlruns",
                                 "/tmp/mlruns", "mlruns", None])
def test_a_tracking_store_workers_cannot_reach_is_named(shared, uri) -> None:
    message = _problems(_inputs(shared, tracking_uri=uri))
    assert f"mlflow.mlflow_tracking_uri={uri!r}: a tracking server every node" in message


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "https://mlflow.internal",
                                 "databricks"])
def test_a_tracking_server_passes_the_tracking_check(shared, uri) -> None:
    plan = plan_verl(VerlParams(**TWO_NODES), DataParams(), RewardParams(),
                     _inputs(shared, tracking_uri=uri), gpus_visible=0, training=False,
                     train_rows=16)  # no PreflightError
    # The workers are handed the server to log to.
    assert plan.config.ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_TRACKING_URI == uri


def test_a_password_in_the_tracking_uri_is_refused_and_not_repeated(shared) -> None:
    """verl logs its configuration, the workers' environment with the URI in it, as MLflow
    parameters: the password would be stored in the run (and the error tag would repeat it)."""
    message = _problems(_inputs(shared, tracking_uri="https://ci:s3cret@mlflow.internal:5000"))
    assert ("mlflow.mlflow_tracking_uri='https://***@mlflow.internal:5000': a URI without "
            "credentials") in message
    assert "MLFLOW_TRACKING_PASSWORD" in message and "s3cret" not in message
    # A token as the user name, or in the query; a database's password.
    for uri, shown in (("http://ghp_T0KEN@h:5000", "http://***@h:5000"),
                       ("https://h/?token=T0KEN&x=1", "https://h/?token=***&x=1"),
                       ("postgresql://u:T0KEN@db/mlflow", "postgresql://***@db/mlflow")):
        message = _problems(_inputs(shared, tracking_uri=uri))
        assert f"mlflow.mlflow_tracking_uri={shown!r}: a URI without credentials" in message
        assert "T0KEN" not in message
    # No secret: a database's user name (its password in ~/.pgpass), a word that contains
    # one (author); a signed URL's signature is one.
    from rl_pipeline.tracking.stores import uri_credentials

    assert uri_credentials("postgresql://mlflow@db.internal/mlflow") is None
    assert uri_credentials("https://h/?author=me&page=2") is None
    assert uri_credentials("https://h/?X-Amz-Signature=abc") == "https://h/?X-Amz-Signature=***"


def test_auto_gpus_on_a_cluster_is_refused(shared) -> None:
    assert "train.verl.trainer_n_gpus_per_node='auto': a number on a Ray cluster" in _problems(
        _inputs(shared), trainer_n_gpus_per_node="auto")


def test_a_cluster_nobody_answers_at_stops_training_and_is_reported_when_checking(
        shared) -> None:
    """tests/gpu_boundary/test_ray_cluster_run.py checks a real two-node cluster."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(PreflightError) as failure:
        plan_verl(VerlParams(**TWO_NODES), DataParams(), RewardParams(),
                  _inputs(shared, ray_address=address), gpus_visible=0, training=True,
                  train_rows=16, contact_cluster=True)
    assert f"train.ray_address='{address}': a running Ray cluster: nothing answers" in str(
        failure.value)
    checked = plan_verl(VerlParams(**TWO_NODES), DataParams(), RewardParams(),
                        _inputs(shared, ray_address=address), gpus_visible=0, training=False,
                        train_rows=16, contact_cluster=True)
    assert checked.report["cluster"]["checked"] is False


def test_a_node_that_does_not_share_the_checkpoint_storage_is_named(shared, tmp_path) -> None:
    """The node check as it runs on each node: the first node wrote a token under
    train_checkpoints; a node whose folder at that path is its own does not see it."""
    from rl_pipeline.engines.verl.cluster import WorkerPaths, _node_check, _write_marker

    paths = WorkerPaths(str(shared / "train.parquet"), str(shared / "val.parquet"),
                        str(shared / "model"), str(shared / "checkpoints"))
    marker = str(shared / "checkpoints" / ".shared-storage-check-test")
    assert _write_marker(marker, "token\n") == (None, str(shared / "checkpoints"))
    same = _node_check(paths, None, "compute_score", "sdpa", marker, "token\n")
    assert not [p for p in same["problems"] if "train_checkpoints" in p]
    # Another node: the same path, a folder of its own (here: where the token is not).
    local = WorkerPaths(*[*vars(paths).values()][:3], str(tmp_path / "checkpoints"))
    other = _node_check(local, None, "compute_score", "sdpa",
                        str(tmp_path / "checkpoints" / Path(marker).name), "token\n")
    (problem,) = [p for p in other["problems"] if "train_checkpoints" in p]
    assert "storage shared with the other nodes" in problem and "split" in problem
    assert other["free_gib"] > 0


def test_the_storage_check_leaves_no_folder_it_made(tmp_path) -> None:
    """A check-only preflight: the token goes, and with it the folders made for it; a folder
    that was there stays, and so does one that something else wrote into meanwhile."""
    from rl_pipeline.engines.verl.cluster import _remove_marker, _write_marker

    marker = tmp_path / "runs/checkpoints/.shared-storage-check-x"
    written, made = _write_marker(str(marker), "token\n")
    assert (written, made) == (None, str(tmp_path / "runs"))
    assert marker.read_text() == "token\n"
    _remove_marker(str(marker), made)
    assert list(tmp_path.iterdir()) == []
    # The folder was there: only the token goes.
    marker.parent.mkdir(parents=True)
    assert _write_marker(str(marker), "token\n") == (None, None)
    _remove_marker(str(marker), None)
    assert marker.parent.is_dir() and not marker.exists()
    # Made for the token, but a checkpoint appeared beside it: kept.
    fresh = tmp_path / "other/checkpoints/.shared-storage-check-y"
    written, made = _write_marker(str(fresh), "token\n")
    (fresh.parent / "global_step_1").mkdir()
    _remove_marker(str(fresh), made)
    assert not fresh.exists() and (fresh.parent / "global_step_1").is_dir()


def test_a_node_with_an_old_driver_is_named(shared, old_driver) -> None:
    from rl_pipeline.engines.verl.cluster import WorkerPaths, _node_check

    paths = WorkerPaths(str(shared / "train.parquet"), str(shared / "val.parquet"),
                        str(shared / "model"), str(shared / "checkpoints"))
    result = _node_check(paths, None, "compute_score", "sdpa", None, "")
    assert result["nvidia_driver"] == old_driver
    (problem,) = [p for p in result["problems"] if "driver" in p]
    assert f"the NVIDIA driver on this node is {old_driver}" in problem and "R580" in problem


def test_the_attention_kernel_is_checked_on_each_node(shared) -> None:
    from rl_pipeline.engines.verl.cluster import WorkerPaths, _node_check

    paths = WorkerPaths(str(shared / "train.parquet"), str(shared / "val.parquet"),
                        str(shared / "model"), str(shared / "checkpoints"))
    flash = _node_check(paths, None, "compute_score", "flash_attention_2", None, "")
    assert "flash_attn importable on this node (it is not)" in flash["problems"]
    assert not any("flash_attn" in p for p in _node_check(
        paths, None, "compute_score", "sdpa", None, "")["problems"])


def test_each_node_needs_the_rollout_engine_it_will_run(shared, monkeypatch) -> None:
    """vLLM on a GPU node; nothing beyond transformers for the CPU mode's rollout (hf)."""
    import importlib.util

    from rl_pipeline.engines.verl.cluster import WorkerPaths, _node_check

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    paths = WorkerPaths(str(shared / "train.parquet"), str(shared / "val.parquet"),
                        str(shared / "model"), str(shared / "checkpoints"))
    assert "vllm importable on this node (it is not)" in _node_check(
        paths, None, "compute_score", "sdpa", None, "", "vllm")["problems"]
    assert not any("vllm" in p for p in _node_check(
        paths, None, "compute_score", "sdpa", None, "", "hf")["problems"])


def test_with_a_cluster_address_auto_trains_with_verl_and_eval_will_not_use_this_cpu() -> None:
    from rl_pipeline.engines.lookup import choose_engine
    from rl_pipeline.params import ConfigError
    from rl_pipeline.pipelines.eval.nodes import check_eval_machine

    assert choose_engine("auto", 0)[0] == "trl"  # this machine alone: no GPU, no vLLM
    name, why = choose_engine("auto", 0, "ray://head:10001")
    assert name == "verl" and "ray://head:10001" in why
    with pytest.raises(ConfigError, match=r"eval.backend='auto'.*ray://head:10001.*GPU node"):
        check_eval_machine("auto", "ray://head:10001")
    check_eval_machine("hf", "ray://head:10001")  # on purpose
    check_eval_machine("auto", None)  # no cluster: the CPU is this run's machine


def test_only_nodes_that_take_ranks_join_the_collective() -> None:
    """A head node without GPUs takes no rank: asked for a GPU, NCCL's check task could never
    be placed there. Nor does a node without its CUDA devices (named already) join."""
    from rl_pipeline.engines.verl.cluster import _join_collective
    from rl_pipeline.engines.verl.preflight import Hardware

    head = {"NodeID": "a" * 56, "Resources": {"CPU": 8.0}}
    gpu_node = {"NodeID": "b" * 56, "Resources": {"CPU": 8.0, "GPU": 8.0}}
    report: dict = {}
    assert _join_collective([head], [{"cuda_devices": 0, "declared_gpus": 0}],
                            Hardware(8, 1, 2), report) == []
    assert report["collective"] == {"checked": False, "reason": "no node declares GPUs"}
    assert _join_collective([head, gpu_node], [{"cuda_devices": 0, "declared_gpus": 0},
                                               {"cuda_devices": 0, "declared_gpus": 8}],
                            Hardware(8, 1, 2), report) == []
    assert report["collective"]["reason"] == "a node lacks its CUDA devices"
