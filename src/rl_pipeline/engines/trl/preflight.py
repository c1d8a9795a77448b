"""The trl engine's preflight: the rules TRL would only raise on later, TRL's own GRPOConfig
checks, the model's chat template and the reward on sample rows, all reported together."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from rl_pipeline.engines.problems import PreflightError, Problem, model_code_problem
from rl_pipeline.engines.trl.config import TRAINING_ARGS, grpo_config, lora_config
from rl_pipeline.engines.trl.inputs import plain
from rl_pipeline.engines.work import StepWork
from rl_pipeline.models.facts import lora_target_problem
from rl_pipeline.params import RewardParams
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.self_test import ModelCodeOnHostError, run_self_test


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
        config = grpo_config(params, output_dir, use_cpu=not torch.cuda.is_available(),
                             **TRAINING_ARGS)
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
        if not problems:  # check_trl words the rules it knows by parameter; not twice
            problems.append(Problem("", None, f"TRL's GRPOConfig refuses these settings: "
                                    f"{exc}", group="train.trl"))
    try:
        load_tokenizer(model_path)
    except (OSError, ValueError) as exc:
        problems.append(Problem("base_model", model_path, f"a model with a fast tokenizer and "
                                f"a chat template: {exc}", group="catalog"))
    if params.apply_lora and (allowed := lora_target_problem(model_path,
                                                             params.lora_target_modules)):
        problems.append(Problem("lora_target_modules", params.lora_target_modules, allowed,
                                group="train.trl"))
    rows = pd.read_parquet(train_file).to_dict("records")
    try:
        score = build_reward(reward, strict=True)
        report["reward"], failed = run_self_test(
            lambda row, response, facts: score.score(
                row["data_source"], response, str(row["reward_model"]["ground_truth"]),
                {**(plain(row.get("extra_info")) or {}), **facts}), rows, reward)
        problems += [Problem("data_source", source, message, group="data_prep")
                     for source, message in failed]
    except ModelCodeOnHostError as exc:
        problems.append(model_code_problem(exc, reward.custom_reward_function.name))
    except Exception as exc:  # user code: anything can come out
        problems.append(Problem("name", reward.custom_reward_function.name, f"a reward "
                                f"function that scores the training rows: {exc!r}",
                                group="reward.custom_reward_function"))
    if problems:
        raise PreflightError(problems)
    return report, config_yaml


def step_work(params: TrlParams, train_rows: int, model_path: str) -> StepWork:
    """What each step of this trl run does (the forecast's input).

    GRPOTrainer generates one batch of per_device_train_batch_size x
    gradient_accumulation_steps completions and optimises on it num_iterations times, one
    step each; the old log-probabilities (num_iterations > 1) and the reference's (beta > 0)
    are one forward pass each per generated batch."""
    from rl_pipeline.models.facts import GiB, ModelFacts

    sequences = params.per_device_train_batch_size * params.gradient_accumulation_steps
    prompts = max(1, sequences // params.num_generations)
    steps = params.max_steps if params.max_steps > 0 else int(
        -(-train_rows // prompts) * params.num_iterations * params.num_train_epochs)
    rank = params.lora_rank if params.apply_lora else 0
    facts = ModelFacts.read(model_path, rank, params.lora_target_modules)
    trainable = (facts.lora_parameters if rank else facts.parameters) if facts else 0
    # The adapter (or the model) in float32 and Adam's two moments.
    checkpoint = (4 * trainable + 8 * trainable) / GiB
    saves = steps // params.save_steps
    cuda = torch.cuda.is_available()
    return StepWork(
        engine="trl", steps=steps, prompts=prompts, completions=params.num_generations,
        response_cap=int(params.max_completion_length or 256),
        rollouts_per_step=1 / params.num_iterations,
        log_prob_passes=(int(params.num_iterations > 1) + int(params.beta > 0))
        / params.num_iterations,
        update_passes=1.0, recompute=False, temperature=params.temperature,
        top_p=params.top_p, top_k=-1, seed=params.seed,
        dtype="bfloat16" if cuda else "float32",
        lora={"r": params.lora_rank, "lora_alpha": params.lora_alpha,
              "lora_dropout": params.lora_dropout,
              "target_modules": params.lora_target_modules} if rank else None,
        device="cuda" if cuda else "cpu", devices=1, tensor_parallel=1, saves=saves,
        checkpoint_gib=checkpoint,
        checkpoints_kept=min(saves, params.save_total_limit or saves),
        rollout_backend="vllm" if cuda and params.use_vllm else "hf",
        model_gib=(facts.bytes_on_disk / GiB) if facts else 0.0)
