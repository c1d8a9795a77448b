"""Nodes of the preflight pipeline: the training configuration checked on any machine,
without training (:func:`rl_pipeline.engines.preflight.run_preflight`)."""

from __future__ import annotations

from typing import Any

from rl_pipeline.engines.preflight import Preflight, engine_tags, run_preflight
from rl_pipeline.engines.run_identity import CheckpointRoot
from rl_pipeline.params import DataParams, EvalParams, RewardParams
from rl_pipeline.params.train import TrainParams


def check_training_setup(train_prompts_file: str, val_prompts_file: str, base_model: str,
                         train_checkpoints_dir: CheckpointRoot | str, train: TrainParams,
                         data: DataParams, reward: RewardParams,
                         eval_params: EvalParams | None = None) -> Preflight:
    """Check the training configuration without training (any machine), and forecast the
    run's time and cost (``train.forecast``; eval's from ``eval_params``).

    Returns:
        The plan (engine and launch), the preflight report, the resolved engine config
        (YAML), the equivalent command line, and the resolved ``auto`` values as metrics.
    """
    return run_preflight(train_prompts_file, val_prompts_file, base_model,
                         train_checkpoints_dir, train, data, reward, eval_params,
                         training=False)


def preflight_run_tags(preflight_report: dict[str, Any]) -> dict[str, str]:
    """The preflight run's tags: the engine it checked, its hardware and device."""
    return engine_tags(preflight_report)
