"""The trainer callback that sends each logged step's metrics to the stage's MLflow run."""

from __future__ import annotations

import logging
import math
import re
import time

import numpy as np
from transformers import TrainerCallback

from rl_pipeline.training_rollouts import PREFIX as ROLLOUTS_PREFIX

logger = logging.getLogger(__name__)
_METRIC_NAME = re.compile(r"[^\w\-./ ]")


class StepLogger(TrainerCallback):
    """Logs each logged step's metrics to the active MLflow run as they happen.

    transformers' own MLflowCallback would also log every TrainingArguments field as a
    parameter and start a run of its own when none is active; the stage's run already holds
    the parameters under their spec names, so only metrics are sent, prefixed ``train/``.
    """

    def __init__(self, first_step_forecast_s: float | None = None,
                 log_lines: bool = False) -> None:
        self.history: list[dict[str, float]] = []
        self._log_lines = log_lines  # one INFO line per logged step: the progress off a terminal
        self._started = 0.0
        self._step_seconds: list[float] = []
        self._first_step_forecast_s = first_step_forecast_s  # logged against the first step

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self._step_seconds.append(time.perf_counter() - self._started)
        if self._first_step_forecast_s:
            import mlflow

            from rl_pipeline.engines.forecast import FIRST_STEP_METRIC, first_step_message

            seconds = self._step_seconds[-1]
            logger.log(*first_step_message(state.global_step, seconds,
                                           self._first_step_forecast_s))
            if mlflow.active_run() is not None:
                mlflow.log_metric(FIRST_STEP_METRIC, seconds, step=state.global_step)
            self._first_step_forecast_s = None  # the first step of this run only

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        import mlflow

        numbers = {k: float(v) for k, v in (logs or {}).items()
                   if isinstance(v, int | float) and math.isfinite(v)}
        if self._step_seconds:
            numbers["step_time"] = float(np.mean(self._step_seconds))
            self._step_seconds = []
        if not numbers:
            return
        self.history.append({"step": state.global_step, **numbers})
        if self._log_lines:
            logger.info(progress_line(state.global_step, state.max_steps, numbers))
        if mlflow.active_run() is not None:
            mlflow.log_metrics({_mlflow_name(k): v for k, v in numbers.items()},
                               step=state.global_step)


def _mlflow_name(key: str) -> str:
    """TRL's metrics as train/...; the project's own (rollouts/...) under the names the verl
    engine logs them by."""
    name = _METRIC_NAME.sub("_", key)
    return name if name.startswith(ROLLOUTS_PREFIX) else f"train/{name}"


# What a line of progress shows, of what TRL logs at a step, in this order.
_PROGRESS = (("reward", "reward {:.3g}"), ("loss", "loss {:.4g}"),
             ("completions/mean_length", "{:.1f} tokens"), ("step_time", "{:.1f} s/step"),
             ("train_runtime", "trained in {:.0f} s"))


def progress_line(step: int, max_steps: int, numbers: dict[str, float]) -> str:
    """A logged step as one line: ``step 2/40: reward 0.375, loss -0.0355, ...``."""
    shown = [form.format(numbers[key]) for key, form in _PROGRESS if key in numbers]
    return f"step {step}/{max_steps}: " + (", ".join(shown) or "no metrics")
