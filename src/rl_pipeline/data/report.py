"""The data_prep report: what came in, what went out and why, the prompt lengths, the reward
self-test, its numbers for MLflow, and a length histogram."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: schedulers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from rl_pipeline.data.prepare import DROP_REASONS, SPLITS  # noqa: E402
from rl_pipeline.params import DataParams, DataPrepParams  # noqa: E402

_LISTED_BAD = 20  # skipped or filtered rows quoted in the report (the counts cover all)


def length_histogram(samples: dict[str, np.ndarray], limit: int) -> Figure:
    """Histogram of prompt token lengths per split, with the length limit drawn."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    everything = np.concatenate([s for s in samples.values() if s.size] or [np.zeros(1)])
    top = max(int(everything.max()), limit)
    bins = np.linspace(0, top * 1.05, 60)
    for split, values in samples.items():
        ax.hist(values, bins=bins, alpha=0.6, label=f"{split} (n={values.size})")
    ax.axvline(limit, color="crimson", linestyle="--", linewidth=1.5,
               label=f"data_max_prompt_length = {limit}")
    ax.set_xlabel("prompt tokens (chat template + generation prompt)")
    ax.set_ylabel("prompts")
    ax.set_title("Prompt lengths")
    ax.legend()
    fig.tight_layout()
    plt.close(fig)  # the dataset saves it; keep pyplot's registry from growing
    return fig


def data_prep_report(hygiene: dict[str, Any], lengths: dict[str, Any],
                     self_test: dict[str, Any], data: DataParams,
                     data_prep: DataPrepParams) -> dict[str, Any]:
    """The report (JSON): rows in and out, drops by reason and split, truncations, the
    train/val overlap, prompt-token statistics, the length settings and the self-test."""
    dropped_by_split = {
        s: {r: hygiene["dropped"][s].get(r, 0) + lengths[s]["dropped"].get(r, 0)
            for r in DROP_REASONS} for s in SPLITS}
    rows_out = {s: lengths[s]["rows_out"] for s in SPLITS}
    return {
        "rows_in": {**hygiene["rows_in"], "total": sum(hygiene["rows_in"].values())},
        "rows_out": {**rows_out, "total": sum(rows_out.values())},
        "dropped": {r: sum(dropped_by_split[s][r] for s in SPLITS) for r in DROP_REASONS},
        "dropped_by_split": dropped_by_split,
        "truncated": {s: lengths[s]["truncated"] for s in SPLITS},
        "train_val_overlap": hygiene["train_val_overlap"],
        "prompt_tokens": {s: lengths[s]["stats"] for s in SPLITS},
        "prompt_tokens_note": (
            "Tokens of the chat-templated prompt with the generation prompt, as verl counts "
            f"them. Percentiles over a uniform sample of {data_prep.length_sample_size} rows "
            "where a split has more (sampled: true), else over every row; max over every "
            "exactly counted row."),
        "data_max_prompt_length": data.data_max_prompt_length,
        "data_filter_overlong_prompts": data.data_filter_overlong_prompts,
        "data_truncation": data.data_truncation,
        "train_source": hygiene.get("train_source", ""),
        "val_source": hygiene["val_source"],
        "val_split_off": hygiene.get("val_split_off", 0),
        "tokenizer": lengths["tokenizer"],
        "bad_records_skipped": hygiene["bad_records"][:_LISTED_BAD],
        "rows_filtered": hygiene["filtered_rows"][:_LISTED_BAD],
        "reward_self_test": self_test,
    }


def report_numbers(report: dict[str, Any]) -> dict[str, Any]:
    """The report's numbers for MLflow (nested names; ``mlflow_metrics`` flattens them)."""
    return {**{k: report[k] for k in ("rows_in", "rows_out", "dropped", "truncated",
                                      "train_val_overlap", "prompt_tokens")},
            "reward_self_test": {source: {k: result[k] for k in ("gold_correct",
                                                                 "wrong_below_gold",
                                                                 "agreement") if k in result}
                                 for source, result in report["reward_self_test"].items()
                                 if isinstance(result, dict) and "unchecked" not in result}}


def split_lengths(lengths: dict[str, Any]) -> dict[str, np.ndarray]:
    """Each split's sampled prompt lengths, for :func:`length_histogram`."""
    return {s: np.asarray(lengths[s]["sample_lengths"], dtype=np.int64) for s in SPLITS}
