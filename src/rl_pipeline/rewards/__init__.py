"""Reward functions, shared by evaluation and both training engines.

Every function has verl's reward signature,
``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``,
so the same callable can be given to verl (``custom_reward_function``), wrapped for TRL, and
used by the eval stage. ``extra_info`` carries how the response ended (its length, the cap,
whether it was truncated: :mod:`rl_pipeline.rewards.form`), given by all three. GSM8K
scoring is verl's own (``verl.utils.reward_score.gsm8k``) so that our numbers and verl's
validation numbers agree.
"""

from rl_pipeline.rewards.scoring import (
    PARTS,
    OverlongPenalty,
    Reward,
    RewardFunction,
    SafeReward,
    Scored,
    WeightedReward,
    build_reward,
    compute_score,
    flexible_gsm8k,
    gsm8k_format_credit,
    load_reward_function,
    math_verify_score,
    strict_gsm8k,
)

__all__ = [
    "PARTS",
    "OverlongPenalty",
    "Reward",
    "RewardFunction",
    "SafeReward",
    "Scored",
    "WeightedReward",
    "build_reward",
    "compute_score",
    "flexible_gsm8k",
    "gsm8k_format_credit",
    "load_reward_function",
    "math_verify_score",
    "strict_gsm8k",
]
