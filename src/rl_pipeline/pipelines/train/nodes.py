"""Nodes of the preflight and train pipelines. Each validates its parameter groups, then calls
the Kedro-free engine code in ``rl_pipeline.engines``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pyarrow.parquet as pq
import torch
from matplotlib.figure import Figure

from rl_pipeline.config import DataParams, RewardParams, parse_params
from rl_pipeline.engines import TRAINING_RUN
from rl_pipeline.engines.train_params import TrainParams, choose_engine
from rl_pipeline.engines.trl_engine import plan_trl, reward_curve, train_trl
from rl_pipeline.engines.verl_config import LaunchInputs
from rl_pipeline.engines.verl_engine import (
    plan_verl,
    resolved_config_yaml,
    tracking_uri_for_workers,
    train_verl,
)

logger = logging.getLogger(__name__)
Metrics = dict[str, dict[str, float]]


def check_training_setup(train_prompts_file: str, val_prompts_file: str, base_model: str,
                         train_checkpoints_dir: str, train: dict[str, Any],
                         data: dict[str, Any], reward: dict[str, Any],
                         ) -> tuple[dict[str, Any], dict[str, Any], str, str, Metrics]:
    """Check the training configuration on this machine without training (any machine).

    Returns:
        The plan (engine and launch), the preflight report, the resolved engine config
        (YAML), the equivalent command line, and the resolved ``auto`` values as metrics.
    """
    return _preflight(train_prompts_file, val_prompts_file, base_model, train_checkpoints_dir,
                      train, data, reward, training=False)


def prepare_training(train_prompts_file: str, val_prompts_file: str, base_model: str,
                     train_checkpoints_dir: str, train: dict[str, Any], data: dict[str, Any],
                     reward: dict[str, Any],
                     ) -> tuple[dict[str, Any], dict[str, Any], str, str, Metrics]:
    """The train pipeline's preflight: as :func:`check_training_setup`, and this machine
    must have what the engine needs (verl: the GPUs), checked first."""
    return _preflight(train_prompts_file, val_prompts_file, base_model, train_checkpoints_dir,
                      train, data, reward, training=True)


def train_model(plan: dict[str, Any], train_prompts: pd.DataFrame, val_prompts: pd.DataFrame,
                base_model: str, train_checkpoints_dir: str, train: dict[str, Any],
                reward: dict[str, Any]) -> tuple[str, dict[str, Any], Metrics, Figure]:
    """Train with the planned engine; checkpoints go to ``train_checkpoints``, and a rerun
    resumes from the newest one.

    Returns:
        The folder for ``lora_adapter``, the run summary, its numbers as metrics, and the
        reward curve.
    """
    params = parse_params(TrainParams, train, "train")
    scratch = Path(train_checkpoints_dir).parent
    run = mlflow.active_run()
    if plan["engine"] == "verl":
        summary, adapter = train_verl(plan["overrides"], run.info.run_id if run else None,
                                      scratch_dir=scratch)
        curve = reward_curve(_verl_reward_history(run.info.run_id) if run else [])
    else:
        summary, adapter, curve = train_trl(
            params.trl, parse_params(RewardParams, reward, "reward"), train_prompts,
            val_prompts, base_model, train_checkpoints_dir, scratch_dir=scratch)
    if run is not None:  # so that merge can name the run its model came from
        summary["mlflow_run_id"] = run.info.run_id
        record = Path(adapter) / TRAINING_RUN
        record.write_text(json.dumps({**json.loads(record.read_text()),
                                      "mlflow_run_id": run.info.run_id}, indent=2))
    metrics = {name: {"value": float(summary[name]), "step": 0}
               for name in ("steps", "seconds", "resumed_from_step")}
    return str(adapter), summary, metrics, curve


def _verl_reward_history(run_id: str) -> list[dict[str, float]]:
    # verl logs its mean sequence score per step as critic/score/mean (GRPO included).
    client = mlflow.MlflowClient()
    mean = client.get_metric_history(run_id, "critic/score/mean")
    return [{"step": m.step, "reward": m.value} for m in sorted(mean, key=lambda m: m.step)]


def _preflight(train_prompts_file: str, val_prompts_file: str, base_model: str,
               train_checkpoints_dir: str, train: dict[str, Any], data: dict[str, Any],
               reward: dict[str, Any], *, training: bool,
               ) -> tuple[dict[str, Any], dict[str, Any], str, str, Metrics]:
    params = parse_params(TrainParams, train, "train")
    data_params = parse_params(DataParams, data, "data")
    reward_params = parse_params(RewardParams, reward, "reward")
    gpus = torch.cuda.device_count()
    engine, why = choose_engine(params.engine, gpus)
    logger.info("Engine: %s (%s)", engine, why)
    rows = pq.ParquetFile(train_prompts_file).metadata.num_rows
    if engine == "trl":
        report, config_yaml = plan_trl(params.trl, reward_params, train_prompts_file,
                                       base_model, train_checkpoints_dir, rows)
        command = ("# The trl engine runs in the Kedro node (no separate launcher):\n"
                   "kedro run --pipeline train --params train.engine=trl\n")
        report = {"engine": engine, "engine_reason": why, "train_prompts": rows, **report}
        return ({"engine": engine}, report, config_yaml, command,
                {"train_prompts": {"value": float(rows), "step": 0}})
    inputs = LaunchInputs(
        train_files=train_prompts_file, val_files=val_prompts_file,
        model_path=str(Path(base_model).absolute()),
        checkpoints_dir=train_checkpoints_dir,
        tracking_uri=tracking_uri_for_workers(mlflow.get_tracking_uri()),
        ray_address=params.ray_address or os.environ.get("RAY_ADDRESS") or None)
    plan = plan_verl(params.verl, data_params, reward_params, inputs, gpus_visible=gpus,
                     training=training, train_rows=rows)
    report = {"engine": engine, "engine_reason": why, **plan.report,
              "train_prompts": rows, "overrides": plan.overrides, "command": plan.command}
    metrics = {"resolved_trainer_n_gpus_per_node": plan.hardware.gpus_per_node,
               "resolved_trainer_nnodes": plan.hardware.nnodes,
               "resolved_rollout_tensor_model_parallel_size": plan.hardware.tensor_parallel,
               "train_prompts": rows}
    return ({"engine": engine, "overrides": plan.overrides}, report, resolved_config_yaml(plan),
            plan.command + "\n", {k: {"value": float(v), "step": 0} for k, v in metrics.items()})
