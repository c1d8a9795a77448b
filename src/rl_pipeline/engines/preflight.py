"""The engine-agnostic preflight: choose the engine, give the setup its run identity, and ask
the engine to check it. The preflight pipeline runs it alone; the train pipeline runs it
first, with this machine's hardware checked too (Kedro-free, so that both call it)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rl_pipeline.engines.base import TrainSetup
from rl_pipeline.engines.forecast import forecast_lines, forecast_run
from rl_pipeline.engines.lookup import choose_engine, get_engine
from rl_pipeline.engines.run_identity import CheckpointRoot, RunIdentity, run_identity
from rl_pipeline.params import DataParams, EvalParams, RewardParams
from rl_pipeline.params.train import TrainParams
from rl_pipeline.rewards.judge_server import judge_served
from rl_pipeline.tracking import mlflow_metrics

logger = logging.getLogger(__name__)
Metrics = dict[str, dict[str, float]]
# What preflight returns: the plan (engine and launch), the report, the resolved engine
# config (YAML), the equivalent command line, the resolved `auto` values as metrics.
Preflight = tuple[dict[str, Any], dict[str, Any], str, str, Metrics]


def run_preflight(train_prompts_file: str, val_prompts_file: str, base_model: str,
                  train_checkpoints_dir: CheckpointRoot | str, train: TrainParams,
                  data: DataParams, reward: RewardParams, eval_params: EvalParams | None = None,
                  *, training: bool) -> Preflight:
    """Check the training configuration with the engine ``train.engine`` names (or picks);
    ``training``: this machine must also have what the engine needs to train. Then, with
    ``train.forecast``, forecast the run's time and cost and its eval's (``eval_params``)."""
    name, why = choose_engine(train.engine, torch.cuda.device_count(),
                              train.ray_address or os.environ.get("RAY_ADDRESS") or None)
    logger.info("Engine: %s (%s)", name, why)
    setup, identity = identified_setup(train_prompts_file, val_prompts_file, base_model,
                                       checkpoint_root(train_checkpoints_dir), train, data,
                                       reward, name)
    engine = get_engine(name)
    with judge_served(reward):  # the self-test asks a judge the project serves
        checked = engine.preflight(setup, training=training)
    report = {"engine": name, "engine_reason": why, "train_prompts": setup.train_rows,
              "identity": identity.fingerprint, "checkpoints": setup.checkpoints_dir,
              **checked.report}
    plan = {**checked.plan, "identity": identity.fingerprint}
    extra: dict[str, float] = {}
    if train.forecast and checked.work is not None:
        done = (engine.checkpointed_step(Path(setup.checkpoints_dir))
                if train.resume == "auto" else 0)
        if done >= checked.work.steps:
            # Nothing will train, so no calibration (a minute or two on a CPU) for a forecast.
            forecast = {"basis": f"none: the run in {setup.checkpoints_dir} is complete "
                                 f"(step {done} of {checked.work.steps}), so train only "
                                 "exports it again"}
            logger.info("No forecast: %s", forecast["basis"].removeprefix("none: "))
        else:
            forecast = forecast_run(setup, checked.work, eval_params or EvalParams())
        report["forecast"] = plan["forecast"] = forecast
        if "step_s" in forecast:
            logger.info(forecast_lines(forecast))
            extra = {f"forecast/{k}": forecast[k] for k in (
                "train_s", "eval_s", "peak_memory_gib", "disk_gib", "device_hours", "cost")
                if forecast.get(k) is not None}
            extra["forecast/step_s"] = forecast["step_s"]["total"]
    metrics = mlflow_metrics({**checked.metrics, **extra, "train_prompts": setup.train_rows})
    return plan, report, checked.config_yaml, checked.command, metrics


def engine_tags(report: dict[str, Any]) -> dict[str, str]:
    """The run tags of a preflight ``report``: the engine, its resolved hardware and, where
    the engine chose one, the device."""
    return {"train.engine": report.get("engine", "unknown"),
            **{f"train.hardware.{k}": v for k, v in (report.get("hardware") or {}).items()},
            **({"train.device": report["device"]} if "device" in report else {})}


def identified_setup(train_prompts_file: str, val_prompts_file: str, base_model: str,
                     root: CheckpointRoot, train: TrainParams, data: DataParams,
                     reward: RewardParams, engine: str) -> tuple[TrainSetup, RunIdentity]:
    """The setup with its checkpoints in the folder of its run identity."""
    setup = TrainSetup(train_prompts_file, val_prompts_file, base_model, root.path, train,
                       data, reward)
    identity = run_identity(setup, engine)
    return replace(setup, checkpoints_dir=str(root.folder(identity))), identity


def checkpoint_root(train_checkpoints_dir: CheckpointRoot | str) -> CheckpointRoot:
    """The catalog's checkpoint root (a plain path where a test passes one)."""
    if isinstance(train_checkpoints_dir, CheckpointRoot):
        return train_checkpoints_dir
    return CheckpointRoot(str(train_checkpoints_dir))
