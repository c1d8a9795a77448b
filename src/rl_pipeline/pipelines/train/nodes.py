"""Nodes of the train pipeline: the engine named by ``train.engine`` checks,
trains and exports through one interface (:class:`rl_pipeline.engines.base.Engine`)."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from matplotlib.figure import Figure

from rl_pipeline.engines.base import reward_curve
from rl_pipeline.engines.forecast import forecast_metrics
from rl_pipeline.engines.lookup import get_engine
from rl_pipeline.engines.preflight import (
    Metrics,
    Preflight,
    checkpoint_root,
    engine_tags,
    identified_setup,
    run_preflight,
)
from rl_pipeline.engines.run_identity import (
    CheckpointRoot,
    claim,
    previous_run_id,
    prune,
    training_in,
    what_changed,
)
from rl_pipeline.params import DataParams, EvalParams, RewardParams
from rl_pipeline.params.train import TrainParams
from rl_pipeline.rewards.judge_server import judge_served
from rl_pipeline.tracking import mlflow_metrics
from rl_pipeline.trained_questions import write_trained_questions

logger = logging.getLogger(__name__)


def prepare_training(train_prompts_file: str, val_prompts_file: str, base_model: str,
                     train_checkpoints_dir: CheckpointRoot | str, train: TrainParams,
                     data: DataParams, reward: RewardParams,
                     eval_params: EvalParams | None = None) -> Preflight:
    """The train pipeline's preflight (:func:`rl_pipeline.engines.preflight.run_preflight`):
    and this machine must have what the engine needs (verl: the GPUs), checked first.

    Returns:
        The plan (engine and launch), the preflight report, the resolved engine config
        (YAML), the equivalent command line, and the resolved ``auto`` values as metrics.
    """
    return run_preflight(train_prompts_file, val_prompts_file, base_model,
                         train_checkpoints_dir, train, data, reward, eval_params,
                         training=True)


def train_model(plan: dict[str, Any], train_prompts: pd.DataFrame, val_prompts: pd.DataFrame,
                model_work_dir: str, train_prompts_file: str, val_prompts_file: str,
                base_model: str, train_checkpoints_dir: CheckpointRoot | str, train: TrainParams,
                data: DataParams, reward: RewardParams,
                ) -> tuple[str, dict[str, Any], Metrics, Figure]:
    """Train with the planned engine in the folder of this run's identity
    (:mod:`rl_pipeline.engines.run_identity`): a rerun of the same identity resumes where it
    stopped, or trains no further when it is complete; another identity starts afresh.

    Returns:
        The ``training_result`` folder, the run summary (with the identity and what was
        resumed), its numbers as metrics, and the reward curve.
    """
    root = checkpoint_root(train_checkpoints_dir)
    name = plan["engine"]
    setup, identity = identified_setup(train_prompts_file, val_prompts_file, base_model,
                                        root, train, data, reward, name)
    if identity.fingerprint != plan.get("identity"):
        raise RuntimeError(f"the inputs changed since preflight (run identity "
                           f"{identity.short}, preflight checked {plan.get('identity')}); "
                           "run the train pipeline again")
    folder = Path(setup.checkpoints_dir)
    with training_in(folder):
        return _train_in(folder, plan, setup, identity, train_prompts, val_prompts,
                         model_work_dir, root, train, data, reward)


def _train_in(folder: Path, plan: dict[str, Any], setup: Any, identity: Any,
              train_prompts: pd.DataFrame, val_prompts: pd.DataFrame, model_work_dir: str,
              root: CheckpointRoot, train: TrainParams, data: DataParams,
              reward: RewardParams) -> tuple[str, dict[str, Any], Metrics, Figure]:
    """:func:`train_model`'s work, with the identity's lock held."""
    name = plan["engine"]
    # (a checkpoint given as train.resume starts a new identity on purpose)
    if train.resume == "auto" and not folder.exists() and \
            (changed := what_changed(folder, identity)):
        logger.info("%s", changed)
    if train.resume == "never" and folder.exists():
        logger.info("train.resume=never: discarding the checkpoints in %s", folder)
        shutil.rmtree(folder)
    run_id = run.info.run_id if (run := mlflow.active_run()) else None
    before = claim(folder, identity, run_id)
    engine = get_engine(name)
    started = time.perf_counter()
    with judge_served(reward):  # a judge the project serves, while training asks it
        result = engine.train(plan, setup, train_prompts, val_prompts, run_id)
    seconds = time.perf_counter() - started
    complete = result.summary.get("already_complete", False)
    continued = complete or result.summary.get("resumed_from_step", 0) > 0
    earlier = previous_run_id(before) if continued else None
    result.summary.update({
        "identity": identity.fingerprint, "checkpoints": str(folder), "mlflow_run_id": run_id,
        "resume": train.resume, "resumed": continued, "resumed_from_run": earlier,
        # A complete run is only exported again: its weights are the earlier run's.
        "weights_run_id": earlier if complete else run_id,
        # The model was trained on prompts made with these: its card tells its users.
        "chat_template_kwargs": dict(data.data_apply_chat_template_kwargs),
        # What it was trained from: merge and eval refuse another base_model.
        "base_model": identity.inputs["base_model"],
        "data_sources": sorted(map(str, train_prompts["data_source"].unique()))})
    exported = engine.export(result, Path(model_work_dir))
    # Carried into the merged model, so that eval never scores it on what it trained on.
    write_trained_questions(exported, train_prompts)
    prune(root, folder)
    numbers = {k: result.summary[k] for k in ("steps", "seconds", "resumed_from_step")}
    if plan.get("forecast", {}).get("step_s") and not complete:
        trained = result.summary["steps"] - result.summary.get("resumed_from_step", 0)
        numbers.update(forecast_metrics(plan["forecast"], seconds, trained))
        logger.info("Training took %.0f s, forecast %.0f s (ratio %.2f)", seconds,
                    numbers["forecast/train_s"], numbers.get("forecast/train_ratio", 0.0))
    metrics = mlflow_metrics(numbers)
    return str(exported), result.summary, metrics, reward_curve(result.history, engine.name)


def train_run_tags(preflight_report: dict[str, Any], train_summary: dict[str, Any],
                   ) -> dict[str, str]:
    """The train run's tags: the engine and its hardware, the run identity and what it
    continued (``resumed_from_run``), and the run whose weights the result holds."""
    return {**engine_tags(preflight_report),
            **{f"train.{k}": str(train_summary.get(k)).lower() for k in (
                "identity", "resumed", "resumed_from_step", "resumed_from_run",
                "already_complete", "weights_run_id")}}
