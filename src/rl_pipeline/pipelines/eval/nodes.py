"""Nodes of the eval pipeline: they call the Kedro-free functions in ``rl_pipeline.evaluation``
and ``rl_pipeline.rewards`` (Kedro validates the typed parameter groups before the run)."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from rl_pipeline.config import DataParams, EvalParams, RewardParams, follow
from rl_pipeline.engines.train_params import TrainParams
from rl_pipeline.evaluation.generate import SamplingSettings, generate, pick_backend
from rl_pipeline.evaluation.metrics import model_metrics
from rl_pipeline.evaluation.report import bar_chart, markdown_report
from rl_pipeline.evaluation.scoring import score_generations
from rl_pipeline.rewards import SafeReward, load_reward_function
from rl_pipeline.tracking import mlflow_metrics

logger = logging.getLogger(__name__)


def select_eval_prompts(val_prompts: pd.DataFrame, eval_params: EvalParams) -> pd.DataFrame:
    """The validation prompts to evaluate on: the first ``eval.max_prompts``, or all."""
    params = eval_params
    chosen = val_prompts if params.max_prompts is None else val_prompts.head(params.max_prompts)
    return chosen.reset_index(drop=True)


def evaluate_base(prompts: pd.DataFrame, base_model: str, eval_params: EvalParams,
                  data: DataParams, reward: RewardParams,
                  train: TrainParams) -> pd.DataFrame:
    """Generate with the base model and score every response."""
    return _evaluate(prompts, base_model, "base", eval_params, data, reward, train)


def evaluate_trained(prompts: pd.DataFrame, merged_model: str | None, eval_params: EvalParams,
                     data: DataParams, reward: RewardParams,
                     train: TrainParams) -> pd.DataFrame:
    """Generate with the merged (trained) model and score; empty when there is none yet."""
    if merged_model is None:
        logger.info("No merged_model yet: evaluating the base model only")
        return pd.DataFrame()
    return _evaluate(prompts, merged_model, "trained", eval_params, data, reward, train)


def summarize_eval(
    base: pd.DataFrame, trained: pd.DataFrame, eval_params: EvalParams, data: DataParams,
) -> tuple[pd.DataFrame, dict[str, Any], dict[str, dict[str, float]], str, Figure]:
    """Metrics per model, side by side.

    Returns:
        ``eval_generations`` (all scored responses), ``eval_metrics`` (one object per model
        label), the same metrics for MLflow (``base/strict_accuracy``, ...), the Markdown
        report and the bar chart.
    """
    frames = {label: frame for label, frame in (("base", base), ("trained", trained))
              if not frame.empty}
    metrics = {label: model_metrics(frame.drop(columns="reward_error"),
                                    int(frame["reward_error"].sum()))
               for label, frame in frames.items()}
    settings = _settings(eval_params, data)
    report = markdown_report(metrics, settings)
    for label, values in metrics.items():
        logger.info("%s: strict %.3f, flexible %.3f, mean reward %.3f", label,
                    values["strict_accuracy"], values["flexible_accuracy"], values["mean_reward"])
    generations = pd.concat(frames.values(), ignore_index=True)
    return generations, metrics, mlflow_metrics(metrics, sep="/"), report, bar_chart(metrics)


def _evaluate(prompts: pd.DataFrame, model_path: str, label: str, params: EvalParams,
              data: DataParams, reward: RewardParams, train: TrainParams) -> pd.DataFrame:
    scorer = SafeReward(load_reward_function(reward.custom_reward_function.path,
                                             reward.custom_reward_function.name),
                        strict=reward.strict)
    memory = follow("eval.vllm_gpu_memory_utilization", params.vllm_gpu_memory_utilization,
                    train.verl.rollout_gpu_memory_utilization)
    run = generate(
        model_path, [list(p) for p in prompts["prompt"]], _settings_for(params, data),
        backend=params.backend, batch_size=params.batch_size, dtype=params.dtype,
        vllm_gpu_memory_utilization=memory, label=label)
    logger.info("%s: generated in process %d, peak %s memory %.0f MiB", label, run.pid,
                run.device, run.peak_memory_mib)
    return score_generations(prompts, run.generations, label, scorer)


def _settings_for(params: EvalParams, shared: DataParams) -> SamplingSettings:
    return SamplingSettings(
        max_new_tokens=follow("eval.max_new_tokens", params.max_new_tokens,
                              shared.data_max_response_length),
        n_samples=params.n_samples, greedy=params.greedy,
        temperature=params.rollout_val_temperature, top_p=params.rollout_val_top_p,
        top_k=params.rollout_val_top_k, seed=params.seed)


def _settings(params: EvalParams, shared: DataParams) -> dict[str, Any]:
    sampling = _settings_for(params, shared)
    return {"backend": pick_backend(params.backend),
            "decoding": "greedy" if params.greedy else
            f"sampling (temperature {sampling.temperature}, top_p {sampling.top_p}, "
            f"top_k {sampling.top_k})",
            "samples per prompt": sampling.samples, "max new tokens": sampling.max_new_tokens}
