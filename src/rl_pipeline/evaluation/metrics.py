"""Evaluation metrics: accuracies, rewards, unbiased pass@k, lengths, per data source."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): 1 - C(n-c, k) / C(n, k).

    The probability that at least one of k samples drawn without replacement from n
    samples, c of them correct, is correct. Computed as a product for numerical stability.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def model_metrics(generations: pd.DataFrame, reward_errors: int = 0) -> dict[str, Any]:
    """Metrics of one model over its scored generations.

    Args:
        generations: One row per (prompt, sample) with ``prompt_index``, ``data_source``,
            ``strict``, ``flexible``, ``reward``, ``response_tokens`` and ``truncated``.
        reward_errors: How many reward calls raised (and were scored 0).

    Returns:
        ``strict_accuracy``, ``flexible_accuracy``, ``mean_reward``,
        ``strict_pass_at_k`` and ``flexible_pass_at_k`` for every k up to the number of
        samples, ``mean_response_tokens``, ``truncation_rate``, counts, and ``by_data_source``.
    """
    metrics = _summary(generations)
    metrics["reward_errors"] = int(reward_errors)
    metrics["by_data_source"] = {str(source): _summary(group, with_pass=False)
                                 for source, group in generations.groupby("data_source")}
    return metrics


def _summary(frame: pd.DataFrame, with_pass: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "strict_accuracy": float(frame["strict"].mean()),
        "flexible_accuracy": float(frame["flexible"].mean()),
        "mean_reward": float(frame["reward"].mean()),
        "mean_response_tokens": float(frame["response_tokens"].mean()),
        "truncation_rate": float(frame["truncated"].mean()),
        "prompts": int(frame["prompt_index"].nunique()),
    }
    if not with_pass:
        return out
    per_prompt = frame.groupby("prompt_index").agg(n=("strict", "size"), strict=("strict", "sum"),
                                                   flexible=("flexible", "sum"))
    n = int(per_prompt["n"].min())
    out["samples_per_prompt"] = n
    for kind in ("strict", "flexible"):
        for k in range(1, n + 1):
            out[f"{kind}_pass_at_{k}"] = float(np.mean([
                pass_at_k(int(row.n), int(getattr(row, kind)), k)
                for row in per_prompt.itertuples()]))
    return out
