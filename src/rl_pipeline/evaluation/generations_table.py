"""The generations side by side, for the MLflow table of the eval run
(:class:`~rl_pipeline.datasets.mlflow_table.MlflowTableDataset`)."""

from __future__ import annotations

import pandas as pd

KEYS = ["prompt_index", "sample_index", "data_source", "prompt", "ground_truth"]
PER_MODEL = ["response", "reward", "strict", "flexible", "strict_format", "answer",
             "response_tokens", "truncated", "repetitive", "no_reasoning"]


def generations_table(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (prompt, sample): the prompt and ground truth, then each model's response
    and scores (``base_response``, ``base_reward``, ..., ``trained_response``, ...).

    Args:
        frames: Scored generations per model label (``base``, ``trained``), as
            :func:`~rl_pipeline.evaluation.scoring.score_generations` returns them.
    """
    table = None
    for label, frame in frames.items():
        part = frame[KEYS + [c for c in PER_MODEL if c in frame]].rename(
            columns={c: f"{label}_{c}" for c in PER_MODEL})
        table = part if table is None else table.merge(part, on=KEYS, how="outer")
    if table is None:
        return pd.DataFrame(columns=KEYS)
    return table.sort_values(["prompt_index", "sample_index"]).reset_index(drop=True)
