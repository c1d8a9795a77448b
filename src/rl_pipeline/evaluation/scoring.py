"""Scoring generations with the shared reward functions."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from rl_pipeline.evaluation.generate import Generation
from rl_pipeline.rewards import SafeReward, flexible_gsm8k, strict_gsm8k


def score_generations(prompts: pd.DataFrame, generations: Sequence[Generation], label: str,
                      reward: SafeReward) -> pd.DataFrame:
    """One row per generation: the prompt, the response, its reward and correctness.

    Args:
        prompts: Prompts in verl's schema (``data_source``, ``prompt``, ``reward_model``, ...).
        generations: The responses, indexed by prompt position.
        label: The model label (``base``, ``trained``).
        reward: The configured reward function.

    Returns:
        Columns ``model``, ``prompt_index``, ``sample_index``, ``data_source``, ``prompt``,
        ``ground_truth``, ``response``, ``response_tokens``, ``truncated``, ``reward``,
        ``reward_error`` (the reward function raised; scored 0), ``strict``, ``flexible``.
    """
    rows = []
    for g in generations:
        errors_before = reward.errors
        row = prompts.iloc[g.prompt_index]
        truth = str(row["reward_model"]["ground_truth"])
        source = str(row["data_source"])
        extra = row["extra_info"] if "extra_info" in prompts else None
        rows.append({
            "model": label, "prompt_index": g.prompt_index, "sample_index": g.sample_index,
            "data_source": source, "prompt": _last_user_message(row["prompt"]),
            "ground_truth": truth, "response": g.text, "response_tokens": g.tokens,
            "truncated": g.truncated,
            "reward": reward(source, g.text, truth, extra),
            "reward_error": reward.errors > errors_before,
            "strict": strict_gsm8k(source, g.text, truth) == 1.0,
            "flexible": flexible_gsm8k(source, g.text, truth) == 1.0,
        })
    return pd.DataFrame(rows)


def _last_user_message(messages) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else ""
