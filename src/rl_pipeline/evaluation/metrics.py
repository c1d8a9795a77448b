"""Evaluation metrics: the headline reward, pass@k, maj@k, mean@n, GSM8K's strict and
flexible accuracies, and the degeneration rates (truncation, repetition, no reasoning) and
response length, per data source.

Every accuracy metric is a mean over prompts of a per-prompt score
(:func:`per_prompt_scores`), so that the paired bootstrap of
:mod:`rl_pipeline.evaluation.significance` can resample prompts. With the same number of
samples for every prompt, the mean over prompts of per-prompt means is the mean over samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from rl_pipeline.evaluation.significance import bootstrap_interval, paired_comparison

# verl's and the built-in rewards pay 1.0 for a correct answer (format credit pays 0.1).
CORRECT_REWARD = 1.0
# Per-prompt shares of samples that degenerate (rl_pipeline.rewards.form): what a reward
# hack raises. Each is compared base to trained with its paired interval, as accuracy is.
DEGENERATION = ("truncation_rate", "repetition_rate", "no_reasoning_rate")


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


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the majority answer of these samples is correct (one prompt's maj@k).

    Samples without an answer (None) do not vote; when none has one, the vote fails. Ties go
    to the answer given first, and the majority answer is as correct as the first sample that
    gave it: verl's ``calc_maj_val`` (dict insertion order, the first value of the winner).
    """
    counts: dict[str, int] = {}
    first: dict[str, bool] = {}
    for answer, ok in zip(answers, correct, strict=True):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first.setdefault(answer, bool(ok))
    if not counts:
        return False
    return first[max(counts, key=counts.__getitem__)]  # max keeps the first of equal counts


def correctness_score(generations: pd.DataFrame | pd.Series, suffix: str = "") -> Any:
    """The score that says whether an answer is right: the reward function's own
    (``function_score``), not the reward with DAPO's overlong penalty, which made a right
    answer that ended near the cap "wrong"; the reward where an older table lacks it."""
    column = f"function_score{suffix}"
    if column in generations:
        return generations[column]
    return generations[f"reward{suffix}"]


def usable_k(pass_k: Sequence[int], samples: int) -> tuple[list[int], list[int]]:
    """The k of ``pass_k`` that ``samples`` samples per prompt allow, and the ones skipped.
    k = 1 is always among them: pass@1 is the verdict's correctness off GSM8K-style sources
    (:mod:`rl_pipeline.evaluation.verdict`)."""
    ks = sorted(set(pass_k) | {1})
    return [k for k in ks if k <= samples], [k for k in ks if k > samples]


def per_prompt_scores(generations: pd.DataFrame, pass_k: Sequence[int] = (1,),
                      correct_reward: float = CORRECT_REWARD) -> pd.DataFrame:
    """Every accuracy metric, per prompt.

    Args:
        generations: One model's scored generations (:func:`~rl_pipeline.evaluation.scoring.
            score_generations`): ``prompt_index``, ``sample_index``, ``data_source``,
            ``reward``, ``strict``, ``flexible``, ``strict_format`` (NaN off GSM8K),
            ``answer``, ``response_tokens``, ``truncated``, ``repetitive`` and
            ``no_reasoning``.
        pass_k: The k of pass@k and maj@k; those above the samples per prompt are left out.
        correct_reward: A sample is correct (pass@k, maj@k) when its reward function's score
            (before the overlong penalty) is at least this.

    Returns:
        One row per prompt (index ``prompt_index``) with ``data_source``, ``samples``,
        ``mean_reward`` (the headline, mean@n), ``pass_at_<k>``, ``maj_at_<k>`` (majority of
        the first k samples), and, on GSM8K prompts (else NaN), ``strict_accuracy``,
        ``flexible_accuracy``, ``strict_pass_at_<k>``, ``flexible_pass_at_<k>`` and
        ``strict_format_rate`` (the share of samples with a strict-match answer); on every
        prompt the :data:`DEGENERATION` rates and ``mean_response_tokens``.
    """
    frame = generations.sort_values(["prompt_index", "sample_index"])
    ks, _ = usable_k(pass_k, int(frame.groupby("prompt_index").size().min()))
    rows = []
    for prompt, group in frame.groupby("prompt_index", sort=True):
        n = len(group)
        correct = (correctness_score(group) >= correct_reward).to_numpy()
        row: dict[str, Any] = {"prompt_index": prompt,
                               "data_source": str(group["data_source"].iloc[0]),
                               "samples": n, "mean_reward": float(group["reward"].mean())}
        for k in ks:
            row[f"pass_at_{k}"] = pass_at_k(n, int(correct.sum()), k)
        answers = [None if pd.isna(a) else str(a) for a in group["answer"]]
        for k in ks:
            row[f"maj_at_{k}"] = float(majority_vote(answers[:k], correct[:k]))
        gsm8k = bool(group["strict"].notna().all())
        for kind in ("strict", "flexible"):
            row[f"{kind}_accuracy"] = float(group[kind].mean()) if gsm8k else np.nan
            for k in ks:
                row[f"{kind}_pass_at_{k}"] = (pass_at_k(n, int(group[kind].sum()), k)
                                              if gsm8k else np.nan)
        # What a small model learns first: answering in the format strict-match reads.
        row["strict_format_rate"] = float(group["strict_format"].mean()) if gsm8k else np.nan
        row["truncation_rate"] = float(group["truncated"].mean())
        row["repetition_rate"] = float(group["repetitive"].mean())
        row["no_reasoning_rate"] = float(group["no_reasoning"].mean())
        row["mean_response_tokens"] = float(group["response_tokens"].mean())
        rows.append(row)
    return pd.DataFrame(rows).set_index("prompt_index")


def comparable_metrics(samples: int, pass_k: Sequence[int]) -> list[str]:
    """Every metric eval compares between two models with ``samples`` samples per prompt and
    ``pass_k``: the columns :func:`per_prompt_scores` gives for one GSM8K-style prompt (the
    function itself answers, so the names have one source)."""
    frame = pd.DataFrame({
        "prompt_index": 0, "sample_index": range(samples), "data_source": "-", "reward": 0.0,
        "strict": 0.0, "flexible": 0.0, "strict_format": 0.0, "answer": None,
        "response_tokens": 1, "truncated": False, "repetitive": False,
        "no_reasoning": False})
    return score_columns(per_prompt_scores(frame, pass_k))


def score_columns(per_prompt: pd.DataFrame) -> list[str]:
    """The per-prompt metrics of a :func:`per_prompt_scores` frame, headline first."""
    return [c for c in per_prompt.columns if c not in ("data_source", "samples")]


def model_metrics(generations: pd.DataFrame,
                  pass_k: Sequence[int] = (1,), correct_reward: float = CORRECT_REWARD,
                  resamples: int = 10_000, seed: int = 42,
                  per_prompt: pd.DataFrame | None = None) -> dict[str, Any]:
    """Metrics of one model over its scored generations.

    Args:
        generations: One row per (prompt, sample), as :func:`per_prompt_scores` takes, with
            ``response_tokens``, ``truncated`` and, when the reward failed on a sample (scored
            0), ``reward_error`` (it raised) and ``reward_timeout`` (past its time limit).
        pass_k, correct_reward: See :func:`per_prompt_scores`.
        resamples, seed: The bootstrap of the headline's 95% interval (``mean_reward_ci_low``
            and ``_high``; the seed makes its resampled prompts those of the paired
            comparison).
        per_prompt: :func:`per_prompt_scores` of ``generations``, when already computed.

    Returns:
        The headline ``mean_reward`` (mean@n, also as ``mean_at_<n>``) with its interval,
        ``pass_at_<k>``, ``maj_at_<k>``, ``strict_accuracy``, ``flexible_accuracy``,
        ``strict_pass_at_<k>``, ``flexible_pass_at_<k>``, ``strict_format_rate`` (over GSM8K
        prompts; None when there are none), ``truncation_rate``, ``repetition_rate``,
        ``no_reasoning_rate``, ``mean_response_tokens``, ``prompts``, ``gsm8k_prompts``,
        ``samples_per_prompt``, ``reward_errors``, ``reward_timeouts``, with ``reward.terms``
        each term's mean (``mean_term_<label>``), with the judge reward its totals
        (``judge_prompt_tokens``, ``judge_completion_tokens``, ``judge_unparsed``,
        ``judge_cached``), and the same per data source in
        ``by_data_source``.
    """
    if per_prompt is None:
        per_prompt = per_prompt_scores(generations, pass_k, correct_reward)
    metrics = _summary(per_prompt, resamples, seed)
    for column, name in (("reward_error", "reward_errors"), ("reward_timeout", "reward_timeouts")):
        metrics[name] = int(generations[column].sum()) if column in generations else 0
    for column in sorted(c for c in generations.columns if c.startswith("term_")):
        metrics[f"mean_{column}"] = float(generations[column].mean())  # reward.terms
    for column in sorted(c for c in generations.columns if c.startswith("judge_")):
        metrics[column] = int(generations[column].sum())  # the judge's tokens and counts
    metrics["by_data_source"] = {
        str(source): _summary(per_prompt[per_prompt["data_source"] == source], resamples, seed)
        for source in sorted(per_prompt["data_source"].unique())}
    return metrics


def _summary(per_prompt: pd.DataFrame, resamples: int, seed: int) -> dict[str, Any]:
    n = int(per_prompt["samples"].min())
    headline = per_prompt["mean_reward"].to_numpy()
    low, high = bootstrap_interval(headline, resamples, seed)
    out: dict[str, Any] = {"mean_reward": float(headline.mean()),
                           "mean_reward_ci_low": low, "mean_reward_ci_high": high,
                           f"mean_at_{n}": float(headline.mean())}
    for column in score_columns(per_prompt):
        if column == "mean_reward":
            continue
        values = per_prompt[column].dropna()
        out[column] = float(values.mean()) if len(values) else None
    out.update({
        "prompts": len(per_prompt),
        "gsm8k_prompts": int(per_prompt["strict_accuracy"].notna().sum()),
        "samples_per_prompt": n,
    })
    return out


def compare_models(base: pd.DataFrame, trained: pd.DataFrame, resamples: int = 10_000,
                   seed: int = 42) -> dict[str, Any]:
    """Every per-prompt metric's difference trained - base, with its paired 95% interval.

    Args:
        base, trained: :func:`per_prompt_scores` of the two models on the same prompts.
        resamples, seed: The paired bootstrap's (:func:`~rl_pipeline.evaluation.significance.
            paired_comparison`).

    Returns:
        ``{metric: comparison}`` over all prompts, and ``by_data_source``: the same within each
        source's prompts. A metric is compared over the prompts where both models have it
        (strict and flexible: the GSM8K prompts).

    Raises:
        ValueError: When the two models were not evaluated on the same prompts.
    """
    if list(base.index) != list(trained.index) or \
            list(base["data_source"]) != list(trained["data_source"]):
        raise ValueError("base and trained must be scored on the same prompts to be compared; "
                         f"got {len(base)} and {len(trained)} prompts that differ")
    columns = [c for c in score_columns(base) if c in trained.columns]

    def compare(rows: pd.Series) -> dict[str, Any]:
        out = {}
        for column in columns:
            both = rows & base[column].notna() & trained[column].notna()
            if both.any():
                out[column] = paired_comparison(base.loc[both, column].to_numpy(),
                                                trained.loc[both, column].to_numpy(),
                                                resamples, seed)
        return out

    everything = pd.Series(True, index=base.index)
    result = compare(everything)
    result["by_data_source"] = {str(source): compare(base["data_source"] == source)
                                for source in sorted(base["data_source"].unique())}
    return result
