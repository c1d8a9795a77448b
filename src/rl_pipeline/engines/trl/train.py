"""Training with TRL's GRPOTrainer, resuming from the newest checkpoint of the run."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import TrainerCallback
from transformers.integrations import MLflowCallback
from transformers.trainer_callback import PrinterCallback

from rl_pipeline.engines.base import TrainRun
from rl_pipeline.engines.trl.callbacks import StepLogger
from rl_pipeline.engines.trl.checkpoints import last_checkpoint
from rl_pipeline.engines.trl.config import TRAINING_ARGS, grpo_config, lora_config
from rl_pipeline.engines.trl.inputs import TrlReward, prompts_dataset
from rl_pipeline.engines.trl.reinforce_pp import trainer_class
from rl_pipeline.params import ConfigError, RewardParams
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.plain_output import progress_bars_shown

logger = logging.getLogger(__name__)

def train_trl(params: TrlParams, reward: RewardParams, train_prompts: pd.DataFrame,
              val_prompts: pd.DataFrame | None, model_path: str, output_dir: str | Path,
              callbacks: Sequence[TrainerCallback] = (), resume: str = "auto",
              rollouts_per_step: int = 0, first_step_forecast_s: float | None = None,
              ) -> TrainRun:
    """Train, resuming from the newest checkpoint in ``output_dir`` when there is one; a run
    whose newest checkpoint is its last step is complete and trains no further.

    Args:
        params: ``train.trl``, its followers resolved
            (:func:`rl_pipeline.params.resolve_followers`).
        reward: The ``reward`` group.
        train_prompts: ``train_prompts`` (verl's schema).
        val_prompts: ``val_prompts``, used when ``do_eval``.
        model_path: The resolved base model folder.
        output_dir: ``train_checkpoints``: ``checkpoint-N`` folders (``save_steps``,
            ``save_total_limit``; the last step is always saved); a rerun resumes from the
            newest.
        callbacks: Further trainer callbacks.
        resume: ``train.resume``: auto (the newest checkpoint in ``output_dir``), never, or
            a checkpoint folder to resume from.
        rollouts_per_step: ``train.rollouts_logged_per_step``: rollouts of each step kept
            in the train run's table (:mod:`rl_pipeline.training_rollouts`).
        first_step_forecast_s: The preflight's forecast of the first step, which its time is
            logged against (None: no forecast).

    Returns:
        The run: its summary, the logged history, the checkpoint folder.
    """
    from transformers import AutoTokenizer, set_seed

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    on_cpu = not torch.cuda.is_available()
    newest = last_checkpoint(output_dir, discard_incomplete=True) if resume == "auto" else None
    last = {"auto": str(newest) if newest else None, "never": None}.get(resume, resume)
    if resume == "auto" and last and (done := _completed(Path(last), output_dir, params)):
        return done
    if resume not in ("auto", "never"):
        _check_resumable(Path(resume), params)
    set_seed(params.seed)
    # Off a terminal no bar, and StepLogger's line per step instead of transformers' print of
    # the whole dict (PrinterCallback, removed below).
    bars = progress_bars_shown()
    config = grpo_config(params, str(output_dir), use_cpu=on_cpu, disable_tqdm=not bars,
                         **TRAINING_ARGS)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    step_logger = StepLogger(first_step_forecast_s, log_lines=not bars)
    schedule = GenerationSchedule()
    trainer = trainer_class(params.algorithm_adv_estimator)(
        model=model_path, args=config,
        reward_funcs=[TrlReward(reward, (tokenizer.eos_token_id, tokenizer.pad_token_id),
                                params.max_completion_length, rollouts_per_step)],
        train_dataset=prompts_dataset(train_prompts),
        # config's do_eval: GRPOConfig sets it for any eval_strategy but "no" (the spec's
        # rule), and the trainer then needs the dataset (do_eval false crashed there).
        eval_dataset=(prompts_dataset(val_prompts) if config.do_eval and val_prompts is not None
                      else None),
        processing_class=tokenizer, peft_config=lora_config(params),
        callbacks=[step_logger, schedule, *callbacks])
    schedule.trainer = trainer
    trainer.remove_callback(MLflowCallback)
    trainer.remove_callback(PrinterCallback)
    resumed_from = 0
    if last:
        resumed_from = int(Path(last).name.split("-")[-1])
        logger.info("Resuming from %s", last)
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=last)
    seconds = time.perf_counter() - started

    # The whole run's history: a resumed trainer carries the earlier steps' logs in its state.
    history = _history(trainer.state.log_history) or step_logger.history
    return TrainRun(summary=_summary(params, trainer.state.global_step,
                                     trainer.state.max_steps, resumed_from, seconds,
                                     output_dir, history),
                    history=history, checkpoints=output_dir)


class GenerationSchedule(TrainerCallback):
    """A resumed run generates on the schedule of one never interrupted.

    GRPOTrainer generates a batch's completions once every ``steps_per_generation *
    num_iterations`` micro-steps, counted by ``GRPOTrainer._step``, which a checkpoint does
    not hold: resumed, it restarted at 0, so with ``num_iterations`` > 1 and a checkpoint
    between two generations (``save_steps`` 100 against 3 iterations, the spec's defaults)
    every later generation came at other steps, some batches optimised more often and
    others less. The count is set back to the micro-steps done (``global_step`` times the
    gradient accumulation) when training begins. The first step after the resume still
    generates (the buffered completions were not saved); from the next cycle on, the steps
    are the uninterrupted run's.
    """

    def __init__(self) -> None:
        self.trainer: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is not None and state.global_step:
            self.trainer._step = state.global_step * args.gradient_accumulation_steps


def _check_resumable(checkpoint: Path, params: TrlParams) -> None:
    """Refuse a checkpoint given as ``train.resume`` that is at or past ``max_steps``: the
    trainer took one more optimizer step past it, and exported that."""
    from transformers import TrainerState

    state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    if 0 < params.max_steps <= state.global_step:
        raise ConfigError(f"train.resume={str(checkpoint)!r} is at step {state.global_step}, "
                          f"and train.trl.max_steps={params.max_steps}: nothing is left to "
                          "train. Raise train.trl.max_steps, or resume from an earlier "
                          "checkpoint")


def _completed(last: Path, output_dir: Path, params: TrlParams) -> TrainRun | None:
    """The run in ``output_dir`` when its newest checkpoint is its last step, else None."""
    from transformers import TrainerState

    state = TrainerState.load_from_json(str(last / "trainer_state.json"))
    if state.global_step < state.max_steps:
        return None
    logger.info("The run in %s is complete (step %d of %d): nothing to train; its result is "
                "exported again (train.resume=never trains it afresh)", output_dir,
                state.global_step, state.max_steps)
    history = _history(state.log_history)
    summary = _summary(params, state.global_step, state.max_steps, state.global_step, 0.0,
                       output_dir, history)
    return TrainRun(summary={**summary, "already_complete": True}, history=history,
                    checkpoints=output_dir)


def _summary(params: TrlParams, steps: int, max_steps: int, resumed_from: int,
             seconds: float, output_dir: Path, history: list[dict[str, float]],
             ) -> dict[str, Any]:
    return {"engine": "trl", "algorithm": params.algorithm_adv_estimator,
            "steps": steps, "max_steps": max_steps, "resumed_from_step": resumed_from,
            "already_complete": False, "seconds": round(seconds, 1),
            "checkpoints": str(output_dir),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "lora": params.apply_lora,
            "final_metrics": next(({k: v for k, v in h.items() if k != "step"}
                                   for h in reversed(history) if "reward" in h), {}),
            "first_reward": _first(history, "reward"),
            "last_reward": _first(history[::-1], "reward")}


def _history(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The trainer's per-step logs as :class:`StepLogger` records them."""
    return [{"step": entry["step"], **{k: float(v) for k, v in entry.items()
                                       if k != "step" and isinstance(v, int | float)
                                       and math.isfinite(v)}}
            for entry in log_history if "step" in entry]


def _first(history: list[dict[str, float]], key: str) -> float | None:
    return next((h[key] for h in history if key in h), None)
