"""The one interface of every training engine, and the engines by name.

An engine checks a configuration (:meth:`Engine.preflight`, on any machine), trains
(:meth:`Engine.train`) and exports its newest checkpoint as the folder that merge takes
(:meth:`Engine.export`). All engines take the same :class:`TrainSetup` and give the same
:class:`Preflight` and :class:`TrainRun`, so the train nodes never ask which engine runs, and
a third engine is one new sub-package plus a line in :data:`rl_pipeline.params.train.ENGINES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from rl_pipeline.engines.work import StepWork
from rl_pipeline.params import DataParams, RewardParams, TrainParams
from rl_pipeline.training_rollouts import PREFIX

# The history keys of the reward curve's band (both engines log them each step).
BAND_STD, BAND_MIN, BAND_MAX = (PREFIX + f"reward/{stat}" for stat in ("std", "min", "max"))


@dataclass(frozen=True)
class TrainSetup:
    """What every engine trains from: the catalog's inputs and the parameter groups."""

    train_prompts_file: str
    val_prompts_file: str
    base_model: str
    checkpoints_dir: str
    train: TrainParams
    data: DataParams
    reward: RewardParams

    @cached_property
    def train_rows(self) -> int:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.train_prompts_file).metadata.num_rows


@dataclass
class Preflight:
    """A checked configuration: what :meth:`Engine.train` needs and what to show a reviewer.

    ``plan`` is JSON (the ``train_plan`` catalog entry): the engine's name and its launch.
    ``work``: what each step does, for the forecast (None: the engine gives none).
    """

    plan: dict[str, Any]
    report: dict[str, Any]
    config_yaml: str
    command: str
    metrics: dict[str, float] = field(default_factory=dict)
    work: StepWork | None = None


@dataclass
class TrainRun:
    """A finished training run: its summary, per-step history, and checkpoint folder."""

    summary: dict[str, Any]
    history: list[dict[str, float]]
    checkpoints: Path


class Engine(ABC):
    """A training back end."""

    name: ClassVar[str]

    @abstractmethod
    def preflight(self, setup: TrainSetup, *, training: bool) -> Preflight:
        """Check the configuration, reporting every problem at once.

        Args:
            setup: The inputs and parameters.
            training: Training starts next on this machine, so it must have what the engine
                needs (GPUs, the rollout engine); otherwise only the configuration is checked.

        Raises:
            ConfigError: Naming each invalid parameter, its value and what is allowed.
        """

    @abstractmethod
    def train(self, plan: dict[str, Any], setup: TrainSetup, train_prompts: pd.DataFrame,
              val_prompts: pd.DataFrame, run_id: str | None) -> TrainRun:
        """Train as ``plan`` says, checkpointing into ``setup.checkpoints_dir``.

        ``run_id`` is the train stage's MLflow run: per-step metrics go there.
        """

    def checkpointed_step(self, checkpoints_dir: Path) -> int:
        """The step of the newest checkpoint in ``checkpoints_dir``, where a rerun with
        ``train.resume: auto`` goes on (0: none, or an engine that cannot say)."""
        return 0

    @abstractmethod
    def export(self, run: TrainRun, scratch_dir: Path) -> Path:
        """The newest checkpoint as merge takes it: a peft adapter folder or a whole Hugging
        Face model folder, described by its :class:`~rl_pipeline.training_result.
        TrainingResult`; built under ``scratch_dir``, hidden (the catalog moves it)."""


def reward_curve(history: list[dict[str, float]], engine: str) -> Figure:
    """Mean reward per logged step, with a band of one standard deviation that stays within
    the step's lowest and highest reward (unclipped, a 0/1 reward's band would reach beyond
    0 and 1, where no sample lies). The spread is :func:`~rl_pipeline.training_rollouts.
    step_metrics`'s, over the step's rollouts; TRL's own ``reward_std`` where a history has
    none (a run logged before it)."""
    figure = Figure(figsize=(7, 4))
    axes = figure.subplots()
    rows = [h for h in history if "reward" in h]
    if rows:
        steps = np.array([h["step"] for h in rows])
        mean = np.array([h["reward"] for h in rows])
        std = np.array([h.get(BAND_STD, h.get("reward_std", 0.0)) for h in rows])
        low = np.array([h.get(BAND_MIN, -np.inf) for h in rows])
        high = np.array([h.get(BAND_MAX, np.inf) for h in rows])
        axes.plot(steps, mean, marker="o", label="mean reward")
        axes.fill_between(steps, np.maximum(mean - std, low), np.minimum(mean + std, high),
                          alpha=0.2, label="± std, within the step's min and max")
        # Below the axes: a reward that swings from step to step leaves no empty corner.
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncols=2, frameon=False)
    else:
        axes.text(0.5, 0.5, "no reward logged", ha="center", va="center")
    axes.set_xlabel("step")
    axes.set_ylabel("reward")
    axes.set_title(f"Training reward ({engine} engine)")
    figure.tight_layout()
    return figure
