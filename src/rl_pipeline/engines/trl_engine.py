"""The trl engine: GRPO (or REINFORCE++ advantages) with TRL's GRPOTrainer, on CPU or GPU.

It takes what the verl engine takes (the prompt parquet in verl's schema, the base model,
the ``reward`` group's function) and gives what it gives (checkpoints, a LoRA adapter with
``training_run.json``, a summary), so merge and eval do not care which engine trained.
:class:`TrlEngine` is the :class:`~rl_pipeline.engines.base.Engine` the train nodes call.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from transformers import TrainerCallback

from rl_pipeline.config import RewardParams
from rl_pipeline.debris import work_dir
from rl_pipeline.engines.base import (
    Engine,
    Preflight,
    TrainRun,
    TrainSetup,
    write_training_run,
)
from rl_pipeline.engines.trl_config import grpo_config, lora_config, with_owners
from rl_pipeline.engines.trl_params import TrlParams
from rl_pipeline.engines.verl_preflight import PreflightError, Problem
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.form import response_facts
from rl_pipeline.rewards.self_test import run_self_test

logger = logging.getLogger(__name__)
_METRIC_NAME = re.compile(r"[^\w\-./ ]")


def prompts_dataset(frame: pd.DataFrame) -> Any:
    """verl-schema prompt rows as TRL's conversational dataset.

    ``prompt`` holds the chat messages; ``data_source``, ``ground_truth`` and
    ``extra_info`` (JSON text, as Arrow cannot hold free-form dicts) go to the reward.
    """
    from datasets import Dataset

    return Dataset.from_dict({
        "prompt": [[{"role": str(m["role"]), "content": str(m["content"])} for m in p]
                   for p in frame["prompt"]],
        "data_source": [str(s) for s in frame["data_source"]],
        "ground_truth": [str(rm["ground_truth"]) for rm in frame["reward_model"]],
        "extra_info": [json.dumps(_plain(e)) for e in frame.get("extra_info",
                                                               [None] * len(frame))],
    })


class TrlReward:
    """The ``reward`` group's function (verl's signature) as a TRL reward function.

    TRL passes each completion's token ids; whether it ended by itself (its last token an
    end-of-sequence or padding token, TRL's own ``mask_truncated_completions`` test) and its
    length go to the reward in ``extra_info`` (:func:`~rl_pipeline.rewards.form.
    response_facts`), as eval and the verl engine give them.
    """

    def __init__(self, reward: RewardParams, stop_ids: Sequence[int | None] = (),
                 max_completion_length: int | None = None) -> None:
        self.safe = build_reward(reward)
        self.stop_ids = {i for i in stop_ids if i is not None}
        self.cap = max_completion_length
        self.__name__ = reward.custom_reward_function.name  # TRL names its metrics after it

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 data_source: Sequence[str], ground_truth: Sequence[str],
                 extra_info: Sequence[str], completion_ids: Sequence[Sequence[int]] = (),
                 **_: Any) -> list[float]:
        ids = list(completion_ids) or [None] * len(completions)
        return [self.safe(source, _text(completion), truth,
                          {**(json.loads(info) or {}), **self._facts(tokens)})
                for completion, source, truth, info, tokens in zip(
                    completions, data_source, ground_truth, extra_info, ids, strict=True)]

    def _facts(self, tokens: Sequence[int] | None) -> dict[str, Any]:
        if tokens is None or self.cap is None:
            return {}
        ended = bool(tokens) and tokens[-1] in self.stop_ids
        return response_facts(len(tokens), self.cap, truncated=not ended)


class StepLogger(TrainerCallback):
    """Logs each logged step's metrics to the active MLflow run as they happen.

    transformers' own MLflowCallback would also log every TrainingArguments field as a
    parameter and start a run of its own when none is active; the stage's run already holds
    the parameters under their spec names, so only metrics are sent, prefixed ``train/``.
    """

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []
        self._started = 0.0
        self._step_seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self._step_seconds.append(time.perf_counter() - self._started)

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
        if mlflow.active_run() is not None:
            mlflow.log_metrics({f"train/{_METRIC_NAME.sub('_', k)}": v
                                for k, v in numbers.items()}, step=state.global_step)


def check_trl(params: TrlParams, train_rows: int, processes: int = 1) -> list[Problem]:
    """Rules GRPOConfig and GRPOTrainer would only raise on later, named by spec parameter."""
    problems = []

    def fail(parameter: str, allowed: str) -> None:
        problems.append(Problem(parameter, getattr(params, parameter), allowed,
                                group="train.trl"))

    batch = processes * params.per_device_train_batch_size * params.gradient_accumulation_steps
    if batch % params.num_generations:
        fail("num_generations", f"a divisor of the effective batch {batch} (processes "
             f"{processes} x per_device_train_batch_size {params.per_device_train_batch_size} "
             f"x gradient_accumulation_steps {params.gradient_accumulation_steps})")
    if train_rows * params.num_generations < batch:
        fail("per_device_train_batch_size", f"a batch that {train_rows} training prompts x "
             f"{params.num_generations} generations can fill")
    if params.do_eval and params.eval_strategy == "no":
        fail("eval_strategy", "steps or epoch when do_eval is true")
    return problems


def plan_trl(params: TrlParams, reward: RewardParams, train_file: str, model_path: str,
             output_dir: str, train_rows: int) -> tuple[dict[str, Any], str]:
    """Check a trl run before it starts: the rules above, TRL's own GRPOConfig checks, the
    model's chat template and the reward on sample rows; all problems together.

    Returns:
        The report, and the resolved GRPOConfig and LoRA settings as YAML.

    Raises:
        PreflightError: Listing every problem.
    """
    import yaml

    from rl_pipeline.models.tokenizer import load_tokenizer

    problems = check_trl(params, train_rows)
    report: dict[str, Any] = {"device": "cuda" if torch.cuda.is_available() else "cpu"}
    config_yaml = ""
    try:
        config = grpo_config(params, output_dir, use_cpu=not torch.cuda.is_available())
        lora = lora_config(params)
        config_yaml = yaml.safe_dump({
            "grpo_config": {k: v for k, v in config.to_dict().items()
                            if isinstance(v, str | int | float | bool | type(None) | list)},
            "peft_lora_config": (None if lora is None else
                                 {"r": lora.r, "lora_alpha": lora.lora_alpha,
                                  "lora_dropout": lora.lora_dropout,
                                  "target_modules": sorted(lora.target_modules)
                                  if isinstance(lora.target_modules, set | list)
                                  else lora.target_modules})}, sort_keys=False)
    except ValueError as exc:  # TRL's and transformers' own argument checks
        problems.append(Problem("(GRPOConfig)", None, str(exc), group="train.trl"))
    try:
        load_tokenizer(model_path)
    except (OSError, ValueError) as exc:
        problems.append(Problem("base_model", model_path, f"a model with a fast tokenizer and "
                                f"a chat template: {exc}", group="catalog"))
    rows = pd.read_parquet(train_file).to_dict("records")
    try:
        score = build_reward(reward, strict=True)
        report["reward"], failed = run_self_test(
            lambda row, response, facts: score(
                row["data_source"], response, str(row["reward_model"]["ground_truth"]),
                {**(_plain(row.get("extra_info")) or {}), **facts}), rows, reward)
        problems += [Problem("data_source", source, message, group="data_prep")
                     for source, message in failed]
    except Exception as exc:  # user code: anything can come out
        problems.append(Problem("name", reward.custom_reward_function.name, f"a reward "
                                f"function that scores the training rows: {exc!r}",
                                group="reward.custom_reward_function"))
    if problems:
        raise PreflightError(problems)
    return report, config_yaml


def train_trl(params: TrlParams, reward: RewardParams, train_prompts: pd.DataFrame,
              val_prompts: pd.DataFrame | None, model_path: str, output_dir: str | Path,
              callbacks: Sequence[TrainerCallback] = (), resume: str = "auto") -> TrainRun:
    """Train, resuming from the newest checkpoint in ``output_dir`` when there is one; a run
    whose newest checkpoint is its last step is complete and trains no further.

    Args:
        params: ``train.trl``, its followers resolved (:func:`with_owners`).
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

    Returns:
        The run: its summary, the logged history, the checkpoint folder.
    """
    from transformers import AutoTokenizer, set_seed
    from transformers.trainer_utils import get_last_checkpoint

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    on_cpu = not torch.cuda.is_available()
    last = {"auto": get_last_checkpoint(str(output_dir)), "never": None}.get(resume, resume)
    if resume == "auto" and last and (done := _completed(Path(last), output_dir, params)):
        return done
    set_seed(params.seed)
    config = grpo_config(params, str(output_dir), use_cpu=on_cpu, save_strategy="steps",
                         logging_strategy="steps", disable_tqdm=False)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    step_logger = StepLogger()
    trainer = trainer_class(params.algorithm_adv_estimator)(
        model=model_path, args=config,
        reward_funcs=[TrlReward(reward, (tokenizer.eos_token_id, tokenizer.pad_token_id),
                                params.max_completion_length)],
        train_dataset=prompts_dataset(train_prompts),
        eval_dataset=(prompts_dataset(val_prompts) if params.do_eval and val_prompts is not None
                      else None),
        processing_class=tokenizer, peft_config=lora_config(params),
        callbacks=[step_logger, *callbacks])
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


# Trainer state in a checkpoint folder: for resuming, not part of the trained model.
_TRAINER_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json",
                  "training_args.bin", "rng_state")


def export_checkpoint(run: TrainRun, scratch_dir: str | Path) -> Path:
    """The newest ``checkpoint-N`` as merge takes it: the adapter (or the whole model, when
    ``apply_lora`` is false) and tokenizer, without the trainer's state. The trainer always
    saves the last step, so this is the trained model."""
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(run.checkpoints))
    if last is None:
        raise RuntimeError(f"the trl run left no checkpoint in {run.checkpoints}")
    Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    out = work_dir("lora-adapter", scratch_dir)
    try:
        for item in Path(last).iterdir():
            if item.is_file() and not item.name.startswith(_TRAINER_STATE):
                shutil.copy2(item, out / item.name)
        write_training_run(out, run.summary, checkpoint=last)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


class TrlEngine(Engine):
    """TRL's GRPOTrainer in the Kedro node's process (CPU or GPU)."""

    name = "trl"

    def preflight(self, setup: TrainSetup, *, training: bool) -> Preflight:
        params = with_owners(setup.train.trl, setup.data)
        report, config_yaml = plan_trl(params, setup.reward, setup.train_prompts_file,
                                       setup.base_model, setup.checkpoints_dir,
                                       setup.train_rows)
        command = ("# The trl engine runs in the Kedro node (no separate launcher):\n"
                   "kedro run --pipeline train --params train.engine=trl\n")
        return Preflight(plan={"engine": self.name}, report=report, config_yaml=config_yaml,
                         command=command)

    def train(self, plan: dict[str, Any], setup: TrainSetup, train_prompts: pd.DataFrame,
              val_prompts: pd.DataFrame, run_id: str | None) -> TrainRun:
        run = train_trl(with_owners(setup.train.trl, setup.data), setup.reward, train_prompts,
                        val_prompts, setup.base_model, setup.checkpoints_dir,
                        resume=setup.train.resume)
        run.summary["mlflow_run_id"] = run_id
        return run

    def export(self, run: TrainRun, scratch_dir: Path) -> Path:
        return export_checkpoint(run, scratch_dir)


@functools.cache
def trainer_class(estimator: str) -> type:
    """TRL's GRPOTrainer for ``grpo``; for ``reinforce_plus_plus`` a subclass with REINFORCE++
    advantages. Built on first use: importing trl takes seconds."""
    from trl import GRPOTrainer
    from trl.trainer.utils import nanstd

    if estimator == "grpo":
        return GRPOTrainer

    class ReinforcePlusPlusTrainer(GRPOTrainer):
        """GRPOTrainer with REINFORCE++ advantages: each reward minus the mean of the whole
        (global) batch, divided by the batch's standard deviation; no per-prompt baseline.

        TRL 1.12 computes GRPO's group advantages inline in ``_generate_and_score_completions``
        with no hook, so this keeps the gathered rewards from ``_calculate_rewards`` and
        replaces the advantages after it returns (before TRL shuffles and splits the batch).
        Both are private methods: trl is pinned, and a test checks the advantages.
        """

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions,
                                                 completion_ids_list)
            self._gathered_rewards = rewards  # (global batch, reward functions)
            return rewards

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            per_function = self._gathered_rewards
            weights = self.reward_weights.to(per_function.device).unsqueeze(0)
            rewards = (per_function * weights).nansum(dim=1)
            rewards[torch.isnan(per_function).all(dim=1)] = torch.nan
            advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
            advantages = torch.nan_to_num(advantages, nan=0.0)
            n, rank = len(inputs), self.accelerator.process_index
            out["advantages"] = advantages[rank * n:(rank + 1) * n]
            return out

    return ReinforcePlusPlusTrainer


def _first(history: list[dict[str, float]], key: str) -> float | None:
    return next((h[key] for h in history if key in h), None)


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", ...}]
        return "".join(str(m.get("content", "")) for m in completion)
    return str(completion)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
