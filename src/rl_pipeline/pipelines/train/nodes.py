"""Nodes of the preflight and train pipelines: the engine named by ``train.engine`` checks,
trains and exports through one interface (:class:`rl_pipeline.engines.base.Engine`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import torch
from matplotlib.figure import Figure

from rl_pipeline.config import DataParams, RewardParams
from rl_pipeline.engines.base import TrainSetup, choose_engine, get_engine, reward_curve
from rl_pipeline.engines.train_params import TrainParams
from rl_pipeline.tracking import mlflow_metrics

logger = logging.getLogger(__name__)
Metrics = dict[str, dict[str, float]]


def check_training_setup(train_prompts_file: str, val_prompts_file: str, base_model: str,
                         train_checkpoints_dir: str, train: TrainParams, data: DataParams,
                         reward: RewardParams,
                         ) -> tuple[dict[str, Any], dict[str, Any], str, str, Metrics]:
    """Check the training configuration without training (any machine).

    Returns:
        The plan (engine and launch), the preflight report, the resolved engine config
        (YAML), the equivalent command line, and the resolved ``auto`` values as metrics.
    """
    setup = TrainSetup(train_prompts_file, val_prompts_file, base_model,
                       train_checkpoints_dir, train, data, reward)
    return _preflight(setup, training=False)


def prepare_training(train_prompts_file: str, val_prompts_file: str, base_model: str,
                     train_checkpoints_dir: str, train: TrainParams, data: DataParams,
                     reward: RewardParams,
                     ) -> tuple[dict[str, Any], dict[str, Any], str, str, Metrics]:
    """The train pipeline's preflight: as :func:`check_training_setup`, and this machine
    must have what the engine needs (verl: the GPUs), checked first."""
    setup = TrainSetup(train_prompts_file, val_prompts_file, base_model,
                       train_checkpoints_dir, train, data, reward)
    return _preflight(setup, training=True)


def train_model(plan: dict[str, Any], train_prompts: pd.DataFrame, val_prompts: pd.DataFrame,
                train_prompts_file: str, val_prompts_file: str, base_model: str,
                train_checkpoints_dir: str, train: TrainParams, data: DataParams,
                reward: RewardParams) -> tuple[str, dict[str, Any], Metrics, Figure]:
    """Train with the planned engine; checkpoints go to ``train_checkpoints``, and a rerun
    resumes from the newest one.

    Returns:
        The folder for ``lora_adapter``, the run summary, its numbers as metrics, and the
        reward curve.
    """
    setup = TrainSetup(train_prompts_file, val_prompts_file, base_model,
                       train_checkpoints_dir, train, data, reward)
    engine = get_engine(plan["engine"])
    run_id = run.info.run_id if (run := mlflow.active_run()) else None
    result = engine.train(plan, setup, train_prompts, val_prompts, run_id)
    adapter = engine.export(result, Path(train_checkpoints_dir).parent)
    metrics = mlflow_metrics({k: result.summary[k]
                              for k in ("steps", "seconds", "resumed_from_step")})
    return str(adapter), result.summary, metrics, reward_curve(result.history, engine.name)


def _preflight(setup: TrainSetup, *, training: bool,
               ) -> tuple[dict[str, Any], dict[str, Any], str, str, Metrics]:
    name, why = choose_engine(setup.train.engine, torch.cuda.device_count())
    logger.info("Engine: %s (%s)", name, why)
    checked = get_engine(name).preflight(setup, training=training)
    report = {"engine": name, "engine_reason": why, "train_prompts": setup.train_rows,
              **checked.report}
    metrics = mlflow_metrics({**checked.metrics, "train_prompts": setup.train_rows})
    return checked.plan, report, checked.config_yaml, checked.command, metrics
