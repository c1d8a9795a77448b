"""Nodes of the eval pipeline: they call the Kedro-free functions in ``rl_pipeline.evaluation``
and ``rl_pipeline.rewards`` (Kedro validates the typed parameter groups before the run)."""

from __future__ import annotations

import logging
import os
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from rl_pipeline.evaluation.examples import pick_examples
from rl_pipeline.evaluation.generate import generate, pick_backend, sampling_settings
from rl_pipeline.evaluation.generations_table import generations_table
from rl_pipeline.evaluation.metrics import (
    compare_models,
    model_metrics,
    per_prompt_scores,
)
from rl_pipeline.evaluation.report import (
    eval_chart,
    for_mlflow,
    markdown_report,
    report_settings,
)
from rl_pipeline.evaluation.scoring import eval_reward, score_generations
from rl_pipeline.evaluation.verdict import eval_verdict
from rl_pipeline.params import ConfigError, DataParams, EvalParams, RewardParams, follow
from rl_pipeline.params.train import TrainParams
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
    reward: RewardParams,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any], dict[str, dict[str, float]], str,
           Figure]:
    """Metrics per model, side by side, and the trained model's differences with intervals.

    Returns:
        ``eval_generations`` (all scored responses), ``eval_generations_table`` (the same,
        base and trained side by side, for MLflow's table view), ``eval_metrics`` (one object
        per model label; the trained one's ``vs_base`` holds the paired comparisons), the
        same metrics for MLflow (``base/mean_reward``, ...), the Markdown report and the chart.
    """
    params = eval_params
    frames = {label: frame for label, frame in (("base", base), ("trained", trained))
              if not frame.empty}
    correct = follow("eval.correct_reward", params.correct_reward, reward.correct_score)
    per_prompt = {label: per_prompt_scores(frame, params.pass_k, correct)
                  for label, frame in frames.items()}
    metrics = {label: model_metrics(frame.drop(columns="reward_error"),
                                    int(frame["reward_error"].sum()), params.pass_k,
                                    correct, params.bootstrap_resamples,
                                    params.seed, per_prompt[label])
               for label, frame in frames.items()}
    examples = None
    if "trained" in frames:
        compared = compare_models(per_prompt["base"], per_prompt["trained"],
                                  params.bootstrap_resamples, params.seed)
        by_source = compared.pop("by_data_source")
        metrics["trained"]["vs_base"] = compared
        for source, comparison in by_source.items():
            metrics["trained"]["by_data_source"][source]["vs_base"] = comparison
        metrics["trained"]["verdict"] = eval_verdict(metrics["trained"]).as_dict()
        examples = pick_examples(frames["base"], frames["trained"], correct)
    report = markdown_report(metrics, report_settings(params, data, reward, metrics["base"]),
                             examples)
    for label, values in metrics.items():
        logger.info("%s: mean reward %.3f (headline), strict %s, flexible %s, strict format "
                    "%s, truncation %.3f, repetition %.3f, no reasoning %.3f", label,
                    values["mean_reward"], values["strict_accuracy"],
                    values["flexible_accuracy"], values["strict_format_rate"],
                    values["truncation_rate"], values["repetition_rate"],
                    values["no_reasoning_rate"])
    if "trained" in frames:
        verdict = metrics["trained"]["verdict"]
        logger.info("eval verdict: %s (%s)", verdict["verdict"], "; ".join(verdict["reasons"]))
    generations = pd.concat(frames.values(), ignore_index=True)
    return (generations, generations_table(frames), metrics,
            mlflow_metrics(for_mlflow(metrics), sep="/"), report, eval_chart(metrics))


def _evaluate(prompts: pd.DataFrame, model_path: str, label: str, params: EvalParams,
              data: DataParams, reward: RewardParams, train: TrainParams) -> pd.DataFrame:
    check_eval_machine(params.backend, train.ray_address or os.environ.get("RAY_ADDRESS"))
    scorer = eval_reward(reward)
    memory = follow("eval.vllm_gpu_memory_utilization", params.vllm_gpu_memory_utilization,
                    train.verl.rollout_gpu_memory_utilization)
    sampling = sampling_settings(params, data)
    run = generate(
        model_path, [list(p) for p in prompts["prompt"]], sampling,
        backend=params.backend, batch_size=params.batch_size, dtype=params.dtype,
        vllm_gpu_memory_utilization=memory, label=label)
    logger.info("%s: generated in process %d, peak %s memory %.0f MiB", label, run.pid,
                run.device, run.peak_memory_mib)
    return score_generations(prompts, run.generations, label, scorer, sampling.max_new_tokens)


def check_eval_machine(backend: str, ray_address: str | None) -> None:
    """Refuse to fall back to a CPU silently where the training ran on a GPU cluster: eval
    runs where ``kedro run`` runs, and a cluster's driver may have no GPU.

    Raises:
        ConfigError: Naming eval.backend, the cluster and the two ways on.
    """
    if backend == "auto" and ray_address and pick_backend("auto") == "hf":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"eval.backend='auto': this machine has no CUDA GPU, and the training ran on "
                f"the Ray cluster at {ray_address} (train.ray_address), so eval would "
                "generate on this CPU, slowly. Run `kedro run --pipelines eval` on a GPU node "
                "of the cluster (with the same project folder on shared storage), or set "
                "eval.backend=hf to generate on this CPU on purpose.")
