"""The hardware environments (conf/gpu1, conf/gpu8, conf/multinode): each loads as `kedro run
--env` loads it, validates as a whole, passes verl's preflight on the GPUs it declares, and
says in its header what it needs and how to launch it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kedro.config import OmegaConfigLoader
from kedro.io import AbstractDataset
from kedro_mlflow.config.kedro_mlflow_config import KedroMlflowConfig

from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl.config import LaunchInputs
from rl_pipeline.engines.verl.engine import tracking_uri_for_workers
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.engines.verl.preflight import Hardware
from rl_pipeline.hooks import WholeConfigurationHook
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.train import TrainParams
from rl_pipeline.settings import CONFIG_LOADER_ARGS
from tests.conftest import PROJECT_ROOT

# Each environment: the GPUs its machine shows, and the hardware verl must resolve there.
ENVIRONMENTS = {"smoke": (1, Hardware(gpus_per_node=1, nnodes=1, tensor_parallel=1)),
                "gpu1": (1, Hardware(gpus_per_node=1, nnodes=1, tensor_parallel=1)),
                "gpu8": (8, Hardware(gpus_per_node=8, nnodes=1, tensor_parallel=2)),
                "multinode": (8, Hardware(gpus_per_node=8, nnodes=2, tensor_parallel=2))}
GSM8K_TRAIN_ROWS = 7473  # train_prompts after data_prep: the batch sizes are checked on it
TRACKING_SERVER = "http://mlflow.internal:5000"
# kedro-mlflow adds this pattern to the project's config loader when the session starts.
MLFLOW_PATTERNS = {"mlflow": ["mlflow*", "mlflow*/**", "**/mlflow*"]}


def _loader(env: str) -> OmegaConfigLoader:
    """The config loader of `kedro run --env ENV`: settings.py's arguments, run env ENV."""
    return OmegaConfigLoader(str(PROJECT_ROOT / "conf"), env=env,
                             **{**CONFIG_LOADER_ARGS, "config_patterns": MLFLOW_PATTERNS})


def _tracking_uri(loader: OmegaConfigLoader) -> str | None:
    """The URI kedro-mlflow tracks to, as the verl engine hands it to the Ray workers."""
    server = KedroMlflowConfig.model_validate({**loader["mlflow"]}).server
    return tracking_uri_for_workers(server.mlflow_tracking_uri
                                    or os.environ.get("MLFLOW_TRACKING_URI", "mlruns"))


@pytest.fixture
def in_project(tmp_path, monkeypatch, inputs) -> Path:
    """A stand-in project folder, the working directory of `kedro run`, whose data/ links to
    the folder holding the tiny model and prompts: data/ on shared storage, as multinode's
    train.shared_root (data) expects it."""
    project = tmp_path / "project"
    project.mkdir()
    shared = os.path.commonpath([inputs.train_files, inputs.model_path])
    (project / "data").symlink_to(shared, target_is_directory=True)
    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", TRACKING_SERVER)
    return project


def _plan(env: str, inputs: LaunchInputs) -> Any:
    loader = _loader(env)
    params = loader["parameters"]
    # The whole-configuration check every `kedro run` makes: each group, and the followers.
    WholeConfigurationHook().after_context_created(
        SimpleNamespace(config_loader={"parameters": params}))
    train = TrainParams.model_validate(params.get("train") or {})
    data = DataParams.model_validate(params.get("data") or {})
    reward = RewardParams.model_validate(params.get("reward") or {})
    assert train.engine == "verl"
    env_inputs = LaunchInputs(**{**vars(inputs), "tracking_uri": _tracking_uri(loader),
                                 "ray_address": train.ray_address or None,
                                 "shared_root": train.shared_root})
    gpus, _ = ENVIRONMENTS[env]
    return plan_verl(train.verl, data, reward, env_inputs, gpus_visible=gpus, training=False,
                     train_rows=GSM8K_TRAIN_ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_environment_passes_verls_preflight_on_its_hardware(env, inputs,
                                                            in_project) -> None:
    plan = _plan(env, inputs)
    assert plan.hardware == ENVIRONMENTS[env][1]
    config = plan.config
    assert config.trainer.n_gpus_per_node == plan.hardware.gpus_per_node
    assert config.trainer.nnodes == plan.hardware.nnodes
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == \
        plan.hardware.tensor_parallel
    assert config.actor_rollout_ref.model.lora_rank > 0  # LoRA everywhere
    assert config.actor_rollout_ref.rollout.n >= 2  # GRPO compares samples of a prompt
    # Each GPU environment rolls out with vLLM, and its forecast decodes at vLLM's pace.
    from rl_pipeline.engines.verl.plan import step_work

    verl = TrainParams.model_validate(_loader(env)["parameters"]["train"]).verl
    assert step_work(config, plan.report["host"], verl).rollout_backend == "vllm"
    if plan.hardware.nnodes > 1:
        assert config.ray_kwargs.ray_init.address == "auto"
        assert config.ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_TRACKING_URI == \
            TRACKING_SERVER


@pytest.mark.slow
def test_multinode_refuses_to_start_without_a_tracking_server(inputs, in_project,
                                                              monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(PreflightError) as err:
        _plan("multinode", inputs)
    assert [p.parameter for p in err.value.problems] == ["mlflow_tracking_uri"]


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_environment_catalog_entries_build(env) -> None:
    """An environment's catalog entries (multinode's base_model copies, link_files: false)
    are arguments their datasets accept."""
    for name, entry in _loader(env)["catalog"].items():
        AbstractDataset.from_config(name, entry)


def _header(path: Path) -> str:
    """The comment lines a file starts with, joined into one line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return re.sub(r"\s+", " ", " ".join(lines))


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_file_of_an_environment_says_its_hardware_memory_and_launch(env) -> None:
    files = sorted((PROJECT_ROOT / "conf" / env).glob("*.yml"))
    assert PROJECT_ROOT / "conf" / env / "parameters.yml" in files
    for path in files:
        header = _header(path)
        assert f"kedro run --env {env}" in header, f"{path}: no launch command"
        assert "GPU" in header, f"{path}: no hardware"
        assert re.search(r"\d+ GB", header), f"{path}: no GPU memory figure"
    parameters = _header(PROJECT_ROOT / "conf" / env / "parameters.yml")
    for what in ("Hardware:", "Expected GPU memory", "Trains:", "--pipelines train"):
        assert what in parameters, f"conf/{env}/parameters.yml: no {what!r}"
