"""Nodes of the eval pipeline: they call the Kedro-free functions in ``rl_pipeline.evaluation``
and ``rl_pipeline.rewards`` (Kedro validates the typed parameter groups before the run)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from rl_pipeline import model_registry
from rl_pipeline.errors import UserError
from rl_pipeline.evaluation.examples import pick_examples
from rl_pipeline.evaluation.generate import generate, pick_backend, sampling_settings
from rl_pipeline.evaluation.generations_table import generations_table
from rl_pipeline.evaluation.metrics import (
    compare_models,
    model_metrics,
    per_prompt_scores,
)
from rl_pipeline.evaluation.report import (
    champion_lines,
    eval_chart,
    for_mlflow,
    markdown_report,
    report_settings,
)
from rl_pipeline.evaluation.scoring import eval_reward, score_generations
from rl_pipeline.evaluation.verdict import eval_verdict
from rl_pipeline.merge import MERGE_METADATA
from rl_pipeline.model_card import MANIFEST, check_manifest, read_manifest, weight_files
from rl_pipeline.models.identity import check_trained_from
from rl_pipeline.models.resolve import METADATA_FILE
from rl_pipeline.params import ConfigError, DataParams, EvalParams, RewardParams
from rl_pipeline.params.model_registry import PromoteParams, RegistryParams
from rl_pipeline.rewards.judge_server import judge_served
from rl_pipeline.runs.jsonfile import read_object
from rl_pipeline.tracking import lineage, mlflow_metrics
from rl_pipeline.trained_questions import trained_on

logger = logging.getLogger(__name__)


class TrainedOnError(UserError, ValueError):
    """Every validation prompt is one a compared model was trained on: no fair comparison."""


def select_eval_prompts(val_prompts: pd.DataFrame, base_model: str, merged_model: str | None,
                        eval_params: EvalParams) -> tuple[pd.DataFrame, dict[str, int]]:
    """What eval compares the trained model with the base model on: the validation prompts
    whose question it was not trained on (:mod:`rl_pipeline.trained_questions`), the first
    ``eval.max_prompts`` of them, or all; first checking that it was trained from
    ``base_model``.

    Returns:
        The prompts, and how they were chosen (``eval_selection``): ``validation_prompts``,
        ``trained_on_prompts`` (left out) and ``evaluated``.

    Raises:
        BaseModelMismatchError: When the trained model was trained from another base model.
        TrainedOnError: When the trained model was trained on every validation question.
    """
    if merged_model is not None:
        run = read_object(Path(merged_model) / MERGE_METADATA).get("training_run") or {}
        check_trained_from(run.get("base_model"), base_model,
                           f"The trained model in {merged_model}",
                           "Eval would compare it with a base it did not start from, and the "
                           "promotion gate would decide on that.")
    held_out = held_out_prompts(val_prompts, merged_model, "the trained model")
    chosen = held_out if eval_params.max_prompts is None else \
        held_out.head(eval_params.max_prompts)
    return chosen.reset_index(drop=True), {
        "validation_prompts": len(val_prompts),
        "trained_on_prompts": len(val_prompts) - len(held_out), "evaluated": len(chosen)}


_RETRAIN = ("Run data_prep as it was when the model trained, or train on the current prompts: "
            "kedro run --pipelines train,merge,eval")


def held_out_prompts(prompts: pd.DataFrame, model: str | None, label: str,
                     remedy: str = _RETRAIN) -> pd.DataFrame:
    """The rows of ``prompts`` whose question the model in folder ``model`` was not trained
    on (all of them when it records none), in their order and with their index; a warning
    names how many were left out, and the first.

    Raises:
        TrainedOnError: When no row is left.
    """
    if model is None:
        return prompts
    seen = trained_on(prompts, model)
    if not seen.any():
        return prompts
    first = prompts.loc[seen].iloc[0]
    question = (first.get("extra_info") or {}).get("question", "") \
        if "extra_info" in prompts else ""
    told = (f"{int(seen.sum())} of the {len(prompts)} validation prompts ask a question "
            f"{label} ({model}) was trained on (the first: {question[:80]!r})")
    if seen.all():
        raise TrainedOnError(
            f"{told}: every one, so eval has no held-out prompt to compare it on. The "
            "validation prompts changed since that model trained (data_prep ran again with "
            f"other data, another split or data_prep.drop_train_val_overlap=false). {remedy}")
    logger.warning("%s: they are left out of its comparisons, which would overstate it",
                   told)
    return prompts.loc[~seen]


def evaluate_base(prompts: pd.DataFrame, base_model: str, eval_params: EvalParams,
                  data: DataParams, reward: RewardParams,
                  ray_address: str | None) -> pd.DataFrame:
    """Generate with the base model and score every response."""
    return _evaluate(prompts, base_model, "base", eval_params, data, reward, ray_address)


def evaluate_trained(prompts: pd.DataFrame, merged_model: str | None, eval_params: EvalParams,
                     data: DataParams, reward: RewardParams,
                     ray_address: str | None) -> pd.DataFrame:
    """Generate with the merged (trained) model and score; empty when there is none yet."""
    if merged_model is None:
        logger.info("No merged_model yet: evaluating the base model only")
        return pd.DataFrame()
    if (Path(merged_model) / MANIFEST).is_file():
        check_manifest(merged_model)  # the model merge verified, file for file
    else:
        logger.warning("%s has no %s (merged before manifests): its files are not checked",
                       merged_model, MANIFEST)
    return _evaluate(prompts, merged_model, "trained", eval_params, data, reward, ray_address)


def evaluate_champion(prompts: pd.DataFrame, merged_model: str | None, trained: pd.DataFrame,
                      registry_params: RegistryParams, promote: PromoteParams,
                      eval_params: EvalParams, data: DataParams, reward: RewardParams,
                      ray_address: str | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The champion's answers on the same prompts: the promotion gate's reference, paired
    with the trained model's. Empty when there is no champion, when ``promote.reference`` is
    base, or when the model evaluated is the champion. A champion with the trained model's
    weights (a rerun of an unchanged training result) answers with the trained model's
    answers, ``trained``, rather than generating them again.

    Returns:
        The champion's scored generations, and which version it is (``champion_model``).

    Raises:
        RegistryError: When the champion's weights are gone.
        ManifestError: When its files differ from its manifest.
    """
    name = registry_params.model_name
    if not name or promote.reference != "champion" or merged_model is None:
        return pd.DataFrame(), {}
    champion = model_registry.alias(name, model_registry.CHAMPION)
    if champion is None or model_registry.is_folder(champion, merged_model):
        return pd.DataFrame(), {}
    folder = model_registry.model_folder(champion, model_registry.CHAMPION)
    held_out = held_out_prompts(prompts, str(folder), f"the champion (version "
                                                      f"{champion.version})",
                                "Compare the trained model with the base model instead: "
                                "promote.reference=base")
    facts = {"name": name, "version": str(champion.version), "path": str(folder),
             "prompts": len(held_out), "trained_on_prompts": len(prompts) - len(held_out)}
    if not trained.empty and _same_weights(folder, merged_model):
        logger.info("The champion (version %s) has the trained model's weights (the same "
                    "SHA-256 for each weight file): its answers are the trained model's, not "
                    "generated again", champion.version)
        frame = trained[trained["prompt_index"].isin(held_out.index)]
        return (frame.assign(model="champion").reset_index(drop=True),
                {**facts, "answers_of": "trained"})
    frame = _evaluate(held_out.reset_index(drop=True), str(folder), "champion", eval_params,
                      data, reward, ray_address)
    # Back to the positions in ``prompts``, where the trained model's answers are.
    frame["prompt_index"] = held_out.index.to_numpy()[frame["prompt_index"].to_numpy()]
    return frame, facts


def _same_weights(champion: Path, merged_model: str) -> bool:
    """Whether both folders' manifests list the same weight files with the same SHA-256
    (both were checked against their manifests before: the champion by
    :func:`~rl_pipeline.model_registry.model_folder`, the merged model by
    :func:`evaluate_trained`)."""
    if not (Path(merged_model) / MANIFEST).is_file():
        return False
    return weight_files(read_manifest(champion)) == weight_files(read_manifest(merged_model))


def summarize_eval(
    base: pd.DataFrame, trained: pd.DataFrame, champion: pd.DataFrame,
    eval_params: EvalParams, data: DataParams, reward: RewardParams,
    selection: dict[str, int] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any], dict[str, dict[str, float]], str,
           Figure]:
    """Metrics per model, side by side, and the trained model's differences with intervals.

    Returns:
        ``eval_generations`` (all scored responses), ``eval_generations_table`` (the same,
        base and trained side by side, for MLflow's table view), ``eval_metrics`` (one object
        per model label; the trained one's ``vs_base`` holds the paired comparisons), the
        same metrics for MLflow (``base/mean_reward``, ...), the Markdown report and the chart.
        The report says which of the validation prompts were evaluated (``selection``, from
        :func:`select_eval_prompts`).
    """
    params = eval_params
    frames = {label: frame for label, frame in (("base", base), ("trained", trained))
              if not frame.empty}
    correct = params.correct_reward
    per_prompt, metrics = {}, {}
    for label, frame in frames.items():
        per_prompt[label], metrics[label] = _scored(frame, params, correct)
    examples = None
    if "trained" in frames:
        _compare(metrics["trained"], "vs_base", per_prompt["base"], per_prompt["trained"],
                 params)
        metrics["trained"]["verdict"] = eval_verdict(metrics["trained"]).as_dict()
        examples = pick_examples(frames["base"], frames["trained"], correct)
    report = markdown_report(
        metrics, report_settings(params, data, reward, metrics["base"], selection), examples)
    if "trained" in frames and not champion.empty:
        # The promotion gate's reference, on the same prompts (paired).
        scores, champion_metrics = _scored(champion, params, correct)
        # Only where the champion was not trained on the question (evaluate_champion).
        _compare(metrics["trained"], "vs_champion", scores,
                 per_prompt["trained"].loc[scores.index], params)
        left_out = len(per_prompt["trained"]) - len(scores)
        report += "\n" + "\n".join(champion_lines(metrics["trained"], left_out)) + "\n"
        metrics["champion"] = champion_metrics
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
            mlflow_metrics(for_mlflow(metrics), sep="/"), report,
            eval_chart({k: v for k, v in metrics.items() if k in frames}))


def record_eval(eval_metrics: dict[str, Any], merged_model: str | None,
                champion_model: dict[str, Any], eval_selection: dict[str, int],
                registry_params: RegistryParams) -> dict[str, Any]:
    """Add eval's results to the registered version of the model evaluated and point the
    alias ``candidate`` at it. The model folder is not touched: it stays as merge published
    and verified it (its card says where eval's results are).

    The gate's evidence is the comparison with the reference on the same prompts: the
    champion evaluated here, else the base model; with how many of the validation prompts
    eval answered, and eval's verdict against the base model.

    A quick check (``eval.max_prompts`` below the validation prompts it could use) is
    recorded, tagged ``eval.quick_check``, only on a version no full eval has recorded
    results on: it is no evidence (the gate refuses it), and it never replaces the evidence
    of a full eval (a champion's own tags said "no change" after an 8-prompt check). Its
    results are in its eval run either way.

    Returns:
        What was recorded (``eval_registry``).
    """
    name = registry_params.model_name
    if not name or merged_model is None or "trained" not in eval_metrics:
        return {"recorded": False}
    usable = eval_selection["validation_prompts"] - eval_selection["trained_on_prompts"]
    quick = eval_selection["evaluated"] < usable
    folder = Path(merged_model)
    version = model_registry.version_for_folder(name, folder)
    trained = eval_metrics["trained"]
    run_id = lineage.active_run_id()
    if version is None:
        logger.warning("%s is no version of the registered model %s (merged without the "
                       "registry, or a merge killed before it registered the model): its eval "
                       "is not recorded there, and promote cannot take it. Register it by "
                       "merging again (kedro run --pipelines merge,eval)", folder, name)
        return {"recorded": False, "path": str(folder)}
    fully_evaluated = model_registry.EVAL_RUN_TAG in version.tags and \
        version.tags.get(model_registry.QUICK_CHECK_TAG) != "true"
    if quick and fully_evaluated:
        logger.info("A quick check (%d of %d validation prompts, eval.max_prompts): %s version "
                    "%s keeps the results of its full eval (run %s); these are in this eval "
                    "run only", eval_selection["evaluated"], usable, name, version.version,
                    version.tags[model_registry.EVAL_RUN_TAG])
        return {"recorded": False, "reason": "quick check", "version": str(version.version)}
    key = "vs_champion" if champion_model.get("version") else "vs_base"
    reference = f"champion:{champion_model['version']}" if key == "vs_champion" else "base"
    # Of the validation prompts, those eval could use: the ones the model was not trained on.
    left_out = eval_selection["trained_on_prompts"]
    evidence = {"reference": reference, "prompts": int(trained["prompts"]),
                "validation_prompts": eval_selection["validation_prompts"] - left_out,
                "trained_on_prompts": left_out, "verdict": trained["verdict"]["verdict"],
                "overall": _comparisons(trained[key]),
                "by_data_source": {source: _comparisons(values[key])
                                   for source, values in trained["by_data_source"].items()
                                   if key in values}}
    results = {**_results(trained), model_registry.QUICK_CHECK_TAG: str(quick).lower()}
    model_registry.record_eval(name, version, results, evidence, run_id)
    return {"recorded": True, "name": name, "version": str(version.version),
            "reference": reference}


def eval_run_tags(eval_metrics: dict[str, Any], merged_model: str | None, base_model: str,
                  champion_model: dict[str, Any], eval_selection: dict[str, int],
                  eval_registry: dict[str, Any]) -> dict[str, str]:
    """The eval run's tags: the models compared (``eval.base_model``: the base's source;
    ``eval.candidate_version``, the registered version of the merged model;
    ``eval.champion_version`` when the champion was evaluated), whether it was a quick
    check, the verdict on what training did (overall, its reasons, and per data source)
    and, for a merged model, the train run whose weights it holds (``source.*``, from
    merge's metadata in the folder)."""
    base = read_object(Path(base_model) / METADATA_FILE).get("source") or base_model
    usable = eval_selection["validation_prompts"] - eval_selection["trained_on_prompts"]
    tags: dict[str, str] = {"eval.base_model": str(base), model_registry.QUICK_CHECK_TAG:
                            str(eval_selection["evaluated"] < usable).lower()}
    if eval_registry.get("version"):
        tags["eval.candidate_version"] = str(eval_registry["version"])
    if champion_model.get("version"):
        tags["eval.champion_version"] = str(champion_model["version"])
    if merged_model is not None:
        metadata = read_object(Path(merged_model) / MERGE_METADATA)
        tags.update(lineage.training_sources(metadata.get("training_run") or {}))
    verdict = eval_metrics.get("trained", {}).get("verdict")
    if verdict is not None:
        tags.update({**verdict_tags(verdict),
                     **{f"eval.verdict.{source}": v["verdict"]
                        for source, v in verdict["by_data_source"].items()}})
    return tags


def verdict_tags(verdict: dict[str, Any]) -> dict[str, str]:
    """The verdict and its reasons as the eval run and the model version carry them."""
    return {"eval.verdict": verdict["verdict"],
            "eval.verdict_reasons": "; ".join(verdict["reasons"])}


def _scored(frame: pd.DataFrame, params: EvalParams, correct: float,
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One model's scores per prompt and its metrics (with their intervals)."""
    scores = per_prompt_scores(frame, params.pass_k, correct)
    return scores, model_metrics(frame, params.pass_k, correct, params.bootstrap_resamples,
                                 params.seed, scores)


def _compare(trained: dict[str, Any], key: str, reference: pd.DataFrame,
             scores: pd.DataFrame, params: EvalParams) -> None:
    """The trained model's paired differences with ``reference``, overall and per data
    source, into its metrics under ``key`` (vs_base, vs_champion)."""
    compared = compare_models(reference, scores, params.bootstrap_resamples, params.seed)
    for source, comparison in compared.pop("by_data_source").items():
        trained["by_data_source"][source][key] = comparison
    trained[key] = compared


def _comparisons(compared: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # The prompts and the sign test too: the gate refuses a comparison that rests on too few
    # prompts, or on too few that changed.
    return {metric: {**{k: float(c[k]) for k in ("delta", "ci_low", "ci_high")},
                     **{k: c[k] for k in ("prompts", "prompts_up", "prompts_down", "p_sign",
                                          "distinguishable") if k in c}}
            for metric, c in compared.items() if isinstance(c, dict) and "ci_low" in c}


def _results(trained: dict[str, Any]) -> dict[str, str]:
    """The version's eval tags: the headline and correctness, their change against the base
    model with the paired interval, and the verdict."""
    out = verdict_tags(trained["verdict"])
    for metric in ("mean_reward", "strict_accuracy", "flexible_accuracy", "pass_at_1"):
        if trained.get(metric) is None:
            continue
        out[f"eval.{metric}"] = f"{trained[metric]:.4f}"
        compared = trained.get("vs_base", {}).get(metric)
        if compared:
            out[f"eval.{metric}.vs_base"] = (f"{compared['delta']:+.4f} "
                                             f"[{compared['ci_low']:+.4f}, "
                                             f"{compared['ci_high']:+.4f}]")
    return out


def _evaluate(prompts: pd.DataFrame, model_path: str, label: str, params: EvalParams,
              data: DataParams, reward: RewardParams, ray_address: str | None) -> pd.DataFrame:
    check_eval_machine(params.backend, ray_address or os.environ.get("RAY_ADDRESS"))
    scorer = eval_reward(reward)
    sampling = sampling_settings(params, data)
    run = generate(
        model_path, [list(p) for p in prompts["prompt"]], sampling,
        backend=params.backend, batch_size=params.batch_size, dtype=params.dtype,
        vllm_gpu_memory_utilization=params.vllm_gpu_memory_utilization, label=label)
    logger.info("%s: generated in process %d, peak %s memory %.0f MiB", label, run.pid,
                run.device, run.peak_memory_mib)
    with judge_served(reward):  # after generating: the judge never shares the GPU with it
        return score_generations(prompts, run.generations, label, scorer,
                                 sampling.max_new_tokens)


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
