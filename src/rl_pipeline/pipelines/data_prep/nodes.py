"""Nodes of the data_prep pipeline: they call the Kedro-free functions in
``rl_pipeline.data`` (Kedro validates the typed parameter groups before the run)."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from rl_pipeline.data.prepare import clean_splits, fit_splits
from rl_pipeline.data.prompts import to_verl_frame
from rl_pipeline.data.records import RawRecords
from rl_pipeline.data.report import (
    data_prep_report,
    length_histogram,
    report_numbers,
    split_lengths,
)
from rl_pipeline.models.tokenizer import load_tokenizer
from rl_pipeline.params import DataParams, DataPrepParams, RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.judge_server import judge_served
from rl_pipeline.rewards.self_test import RewardSelfTestError, run_self_test
from rl_pipeline.tracking import mlflow_metrics

logger = logging.getLogger(__name__)


def clean_prompt_splits(
    raw_train: RawRecords, raw_val: RawRecords | None, data_prep: DataPrepParams,
    data: DataParams,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Map raw records to questions and ground truths; drop bad, empty and duplicate rows.

    Args:
        raw_train: Training records.
        raw_val: Validation records, or None to split validation off train.
        data_prep: The ``data_prep`` parameter group.
        data: The shared ``data`` parameter group (image column).

    Returns:
        The train and validation work frames and the hygiene counts.
    """
    train, val, hygiene = clean_splits(raw_train, raw_val, data_prep, data.data_image_key)
    return train, val, hygiene.as_dict()


def fit_prompt_lengths(
    train_work: pd.DataFrame, val_work: pd.DataFrame, hygiene: dict[str, Any], base_model: str,
    data_prep: DataPrepParams, data: DataParams,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Filter or truncate overlong prompts with the base model's tokenizer; emit verl's schema.

    Args:
        train_work: Train work frame.
        val_work: Validation work frame.
        hygiene: The cleaning counts (``data_prep_hygiene``), for the error on an empty split.
        base_model: Path of the base model (folder or GGUF) whose tokenizer counts tokens.
        data_prep: The ``data_prep`` parameter group.
        data: The shared ``data`` parameter group (length limit, filter, truncation).

    Returns:
        ``train_prompts``, ``val_prompts`` in verl's RLHFDataset schema, and a length summary.

    Raises:
        DataError: When the filter leaves a split empty; neither prompt file is then saved.
    """
    tokenizer = load_tokenizer(base_model, data.data_apply_chat_template_kwargs)
    outputs, summary = [], {"tokenizer": base_model}
    fitted_splits = fit_splits({"train": train_work, "val": val_work}, hygiene, tokenizer,
                               data_prep, data)
    for split, fitted in fitted_splits.items():
        outputs.append(to_verl_frame(fitted.work, data_prep, split, data.data_image_key))
        summary[split] = {"stats": fitted.stats, "dropped": dict(fitted.dropped),
                          "truncated": fitted.truncated, "rows_out": len(outputs[-1]),
                          "sample_lengths": fitted.sample_lengths.tolist()}
    return outputs[0], outputs[1], summary


def check_reward(train: pd.DataFrame, val: pd.DataFrame, reward: RewardParams,
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The reward self-test on the prompts about to be published; they pass through.

    Each data source's ground truths are scored as an ideal response and as a wrong one by
    the ``reward`` group's function (:mod:`rl_pipeline.rewards.self_test`), so that a data
    source the reward cannot read (MATH answers under ``openai/gsm8k``) fails here, before
    the prompt files are saved, and not as a flat zero reward hours into training.

    Returns:
        ``train_prompts`` and ``val_prompts`` unchanged, and the self-test's report.

    Raises:
        RewardSelfTestError: With ``reward.self_test=error``, naming each failing data
            source, its scorer, example rows and the parameter to change.
    """
    score = build_reward(reward, strict=True)  # a raise is reported with its row
    rows = pd.concat([train, val], ignore_index=True).to_dict("records")
    with judge_served(reward):  # a judge the project serves, for the self-test's length
        report, failed = run_self_test(
            lambda row, response, facts: score.score(row["data_source"], response,
                                               str(row["reward_model"]["ground_truth"]),
                                               {**(row.get("extra_info") or {}), **facts}),
            rows, reward)
    if failed:
        raise RewardSelfTestError("\n".join(message for _, message in failed))
    for source, result in report.items():
        if isinstance(result, dict) and "unchecked" in result:
            logger.info("reward self-test, %s (%s): %s", source, result["scorer"],
                        result["unchecked"])
        elif isinstance(result, dict) and "agreement" in result:
            logger.info("reward self-test, %s: the judge %s agrees with the known answers on "
                        "%.0f%% of %d responses", source, result["judge"],
                        100 * result["agreement"], 2 * result["rows"])
        elif isinstance(result, dict):
            logger.info("reward self-test, %s (%s): golds correct %.0f%%, wrong answers lower "
                        "%.0f%%", source, result["scorer"], 100 * result["gold_correct"],
                        100 * result["wrong_below_gold"])
    return train, val, report


def report_data_prep(
    hygiene: dict[str, Any], lengths: dict[str, Any], self_test: dict[str, Any],
    data: DataParams, data_prep: DataPrepParams,
) -> tuple[dict[str, Any], dict[str, dict[str, float]], Figure]:
    """Assemble the data_prep report (:mod:`rl_pipeline.data.report`), its numbers as MLflow
    metrics, and a length histogram.

    Returns:
        The report (JSON), the metrics (``{name: {value, step}}``) and the histogram figure.
    """
    report = data_prep_report(hygiene, lengths, self_test, data, data_prep)
    figure = length_histogram(split_lengths(lengths), data.data_max_prompt_length)
    logger.info("data_prep: %d train and %d val prompts (dropped: %s)",
                report["rows_out"]["train"], report["rows_out"]["val"],
                {r: n for r, n in report["dropped"].items() if n} or "none")
    return report, mlflow_metrics(report_numbers(report)), figure
