"""What the model wrote during training, for both engines: a few rollouts of every step as
an MLflow table in the train run, and eval's degeneration rates over all of the step's
rollouts as metrics (TRL #2948, NeMo-RL #938: reward hacking and rollout bugs show there
before any eval).

Each engine hands over a step's rollouts as :class:`Rollout` records: the trl engine from
its reward function (:class:`rl_pipeline.engines.trl.inputs.TrlReward`, which TRL calls with
a step's completions), the verl engine from its trainer (:mod:`rl_pipeline.engines.verl.
trainer`, reading verl's TransferQueue). :func:`step_metrics` gives the numbers and
:func:`log_table` appends the first few rollouts to :data:`TABLE`.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_pipeline.rewards.form import has_no_reasoning, is_repetitive

logger = logging.getLogger(__name__)

# The train run's artifact holding the logged rollouts, one row each, with their step.
TABLE = "train/rollouts.json"
# The prefix of the per-step numbers, in both engines' train runs (TRL's own metrics are
# train/..., verl's its own names): one curve to compare the engines by.
PREFIX = "rollouts/"
# Prompts and responses are cut to this many characters in the table (the prompt's end,
# where the question is; the response's start): a table that stays readable and small.
TEXT_LIMIT = 1_000


@dataclass(frozen=True)
class Rollout:
    """One sampled response as the reward scored it."""

    prompt: str  # the last user turn of a chat prompt, else the prompt text
    response: str
    ground_truth: str
    reward: float
    truncated: bool  # stopped by the length cap, not by an end-of-sequence token
    parts: dict[str, float] = field(default_factory=dict)  # the reward's terms and counts


def last_user_turn(prompt: Any) -> str:
    """The question of a chat prompt (a list of ``{"role", "content"}`` messages), else the
    prompt as text."""
    if isinstance(prompt, str):
        return prompt
    turns = [m for m in list(prompt) if isinstance(m, dict)]
    users = [m for m in turns if m.get("role") == "user"] or turns
    return str(users[-1].get("content", "")) if users else str(prompt)


def step_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Eval's degeneration rates over a step's rollouts (:data:`~rl_pipeline.evaluation.
    metrics.DEGENERATION`), the mean of each reward part, and the rollouts counted.

    Names are :data:`PREFIX` + ``truncation_rate``, ``repetition_rate``, ``no_reasoning_rate``,
    ``count``, ``reward/mean``, ``reward/std``, ``reward/min``, ``reward/max`` (the reward
    curve's band: its mean is TRL's ``reward`` and verl's ``critic/score/mean``) and
    ``<part>/mean``; the judge's parts (its tokens, unparsed replies, cache hits) also as
    ``<part>/sum``.
    """
    if not rollouts:
        return {}
    n = len(rollouts)
    rewards = [float(r.reward) for r in rollouts if math.isfinite(r.reward)]
    metrics = {
        "truncation_rate": sum(r.truncated for r in rollouts) / n,
        "repetition_rate": sum(is_repetitive(r.response) for r in rollouts) / n,
        "no_reasoning_rate": sum(has_no_reasoning(r.response) for r in rollouts) / n,
        "count": float(n),
    }
    if rewards:  # the reward curve's band: the spread, and the values it reached
        metrics.update({"reward/mean": statistics.fmean(rewards),
                        "reward/std": statistics.pstdev(rewards), "reward/min": min(rewards),
                        "reward/max": max(rewards)})
    for part in sorted({p for r in rollouts for p in r.parts}):
        values = [r.parts[part] for r in rollouts if part in r.parts]
        finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
        if finite:
            metrics[f"{part}/mean"] = sum(finite) / len(finite)
            if part.startswith("judge_"):  # what the judge cost this step, and its misses
                metrics[f"{part}/sum"] = sum(finite)
    return {PREFIX + name: value for name, value in metrics.items()}


def table_rows(step: int, rollouts: Sequence[Rollout], limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` rollouts of a step as table rows (text cut to
    :data:`TEXT_LIMIT` characters)."""
    rows = []
    for r in list(rollouts)[:max(limit, 0)]:
        rows.append({"step": int(step), "prompt": r.prompt[-TEXT_LIMIT:],
                     "response": r.response[:TEXT_LIMIT], "ground_truth": r.ground_truth,
                     "reward": float(r.reward), "truncated": bool(r.truncated),
                     "repetitive": is_repetitive(r.response),
                     "no_reasoning": has_no_reasoning(r.response),
                     **{part: float(v) for part, v in sorted(r.parts.items())}})
    return rows


def log_table(step: int, rollouts: Sequence[Rollout], limit: int) -> int:
    """Append the first ``limit`` rollouts of ``step`` to :data:`TABLE` in the active MLflow
    run (MLflow's ``log_table`` adds the rows to the table already there). Returns the rows
    logged: none without an active run or with ``limit`` 0."""
    import mlflow
    import pandas as pd

    rows = table_rows(step, rollouts, limit)
    if not rows or mlflow.active_run() is None:
        return 0
    try:
        mlflow.log_table(pd.DataFrame(rows), artifact_file=TABLE)
    # The table is for reading, the training is the work: an artifact store that fails for a
    # moment (log_table downloads the table so far and uploads it again) must not end a run
    # hours in; the step's metrics are logged apart.
    except Exception as exc:
        logger.warning("step %d's rollouts were not added to the train run's table %s: %r "
                       "(training goes on)", step, TABLE, exc)
        return 0
    return len(rows)
