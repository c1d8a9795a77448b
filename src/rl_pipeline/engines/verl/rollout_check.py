"""Did verl's rollout sample the policy its actor trained? Read from verl's own metrics.

verl's rollout can silently generate with another policy than the one it trains: its vLLM
server sends a ``LoRARequest`` only when the adapter is listed as loaded
(``vllm_async_server.py``), so an adapter that never arrived means rollouts from the base
model; verl #7904 reports garbled rollouts after the weight sync with
``free_cache_engine=true``. Training then goes on, with importance ratios far from 1 and a
reward curve that means nothing. verl logs, per step, how far the rollout's token
probabilities lie from the actor's on the same tokens
(``training/rollout_probs_diff_mean``, with ``rollout.calculate_log_probs``); this module
turns that into a failure that names the likely causes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DIFF = "training/rollout_probs_diff_mean"
PEARSON = "training/rollout_actor_probs_pearson_corr"


class RolloutPolicyError(RuntimeError):
    """The rollout sampled another policy than the actor trained."""


@dataclass(frozen=True)
class StepAgreement:
    """One step's rollout-versus-actor agreement, as verl logged it."""

    step: int
    probs_diff_mean: float
    pearson: float | None = None


def check_rollout_policy(steps: list[StepAgreement], max_diff: float | None,
                         min_pearson: float | None, where: str) -> dict:
    """Fail when a step's rollout probabilities lie too far from the actor's.

    Two views, because either can miss: the mean gap is small where every probability is
    (a flat distribution, a tiny model), the correlation is noisy where few tokens vary.

    Args:
        steps: verl's metrics per step (empty when verl computed none).
        max_diff: ``train.verl.rollout_max_probs_diff`` (None: not checked).
        min_pearson: ``train.verl.rollout_min_probs_pearson`` (None: not checked).
        where: Where the checkpoints are, for the message.

    Returns:
        The summary: steps checked, the largest gap and its step.

    Raises:
        RolloutPolicyError: Naming the steps, the values, the parameter and the likely causes.
    """
    finite = [s for s in steps if math.isfinite(s.probs_diff_mean)]
    if not finite:
        return {"checked_steps": 0, "max_probs_diff": None}
    worst = max(finite, key=lambda s: s.probs_diff_mean)
    summary = {"checked_steps": len(finite), "max_probs_diff": worst.probs_diff_mean,
               "max_probs_diff_step": worst.step}
    summary["min_pearson"] = min((s.pearson for s in finite if s.pearson is not None),
                                 default=None)

    def off(s: StepAgreement) -> bool:
        return ((max_diff is not None and s.probs_diff_mean > max_diff)
                or (min_pearson is not None and s.pearson is not None
                    and s.pearson < min_pearson))

    bad = [s for s in finite if off(s)]
    if bad:
        listed = ", ".join(f"step {s.step}: mean gap {s.probs_diff_mean:.3g}"
                           + (f", pearson {s.pearson:.3f}" if s.pearson is not None else "")
                           for s in bad[:5])
        raise RolloutPolicyError(
            f"verl's rollout sampled another policy than the actor trained: at {len(bad)} of "
            f"{len(finite)} steps its token probabilities left the actor's ({listed}; "
            f"{DIFF} at most train.verl.rollout_max_probs_diff={max_diff}, {PEARSON} at "
            f"least train.verl.rollout_min_probs_pearson={min_pearson}). Likely causes: the "
            "LoRA adapter never reached the rollout (verl's vLLM server generates with the "
            "base model when the adapter is not loaded); weights garbled by the weight sync "
            "(verl #7904, with rollout_free_cache_engine: true); a rollout dtype far from the "
            f"actor's. The trained model is not to be trusted; the checkpoints are in {where}.")
    return summary


def read_agreement(run_id: str) -> list[StepAgreement]:
    """verl's per-step agreement metrics from the train stage's MLflow run."""
    import mlflow

    client = mlflow.MlflowClient()
    pearson = {m.step: m.value for m in client.get_metric_history(run_id, PEARSON)}
    return [StepAgreement(m.step, m.value, pearson.get(m.step))
            for m in sorted(client.get_metric_history(run_id, DIFF), key=lambda m: m.step)]
