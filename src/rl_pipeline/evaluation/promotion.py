"""The promotion gate: does a candidate replace the reference (the champion, or the base model
when there is none yet)?

It reads the paired comparisons candidate - reference that eval computed on the same prompts
(:func:`~rl_pipeline.evaluation.metrics.compare_models`) and promotes only when

1. the configured metric is better beyond noise (the paired 95% interval's low end above 0,
   its high end below 0 for a metric that is better lower, such as a rate, and the sign test
   of the prompts that changed agreeing: :mod:`~rl_pipeline.evaluation.significance`),
2. no guard metric is worse beyond its tolerance, beyond noise: for a rate that must not
   rise (truncation, repetition, no reasoning, response length) the interval's low end above
   the tolerance; for any other metric (higher is better) the interval's high end below
   minus the tolerance; and the sign test agreeing, and
3. the comparison rests on enough prompts (``promote.min_prompts``): a bootstrap over a
   handful of prompts sees only the differences they happen to show.

A guard is a metric over all prompts (``truncation_rate``) or on one data source
(``openai/gsm8k:strict_accuracy``). A point estimate alone never decides: a candidate that
looks better on the mean but whose interval reaches 0 is refused, as noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_pipeline.evaluation.metrics import DEGENERATION, comparable_metrics
from rl_pipeline.evaluation.significance import signs_disagree
from rl_pipeline.evaluation.verdict import HACKING, WORSE
from rl_pipeline.params.model_registry import FEW_PROMPTS

# Metrics for which higher is worse.
LOWER_IS_BETTER = (*DEGENERATION, "mean_response_tokens")


@dataclass(frozen=True)
class Decision:
    """Promote or not, with the numbers and the rule that decided it."""

    promote: bool
    reasons: list[str]
    comparisons: dict[str, dict[str, float]] = field(default_factory=dict)


def unknown_gate_metrics(metric: str, guards: dict[str, float], samples: int,
                         pass_k: list[int]) -> list[str]:
    """``promote.metric`` and each guard whose metric eval will not compare (with
    ``samples`` per prompt and ``pass_k``), each named with the metrics it will: found as
    the configuration loads, not after training, merge and eval have run."""
    known = comparable_metrics(samples, pass_k)
    allowed = f"eval compares {', '.join(known)}" + (
        " (pass@k and maj@k for k above 1 need eval.n_samples of k or more and eval.greedy "
        "false)" if samples == 1 else "")
    problems = [] if metric in known else [f"promote.metric={metric!r}: {allowed}"]
    return problems + [f"promote.guards.{guard}: {allowed}; a guard names a metric over all "
                       "prompts, or data_source:metric on one source"
                       for guard in guards if guard.rpartition(":")[2] not in known]


def guard_comparison(evidence: dict[str, Any], guard: str) -> dict[str, float] | None:
    """The comparison a guard names: ``metric`` over all prompts, ``source:metric`` on one
    data source; None when eval has no such comparison."""
    source, _, metric = guard.rpartition(":")
    if source:
        return evidence.get("by_data_source", {}).get(source, {}).get(metric)
    return evidence.get("overall", {}).get(metric)


# Eval's verdicts that refuse a candidate whatever it beats.
REFUSED_VERDICTS = (HACKING, WORSE)


def decide_promotion(evidence: dict[str, Any], metric: str, guards: dict[str, float],
                     min_prompts: int = FEW_PROMPTS) -> Decision:
    """The gate's decision on eval's evidence.

    Args:
        evidence: ``{"reference": ..., "prompts": answered, "validation_prompts": of,
            "trained_on_prompts": left out, "verdict": eval's verdict against the base
            model, "overall": {metric: comparison}, "by_data_source": {source: {metric:
            comparison}}}``, each comparison ``delta``, ``ci_low`` and ``ci_high`` of
            candidate - reference, the ``prompts`` it rests on and whether it is
            ``distinguishable`` (with ``prompts_up``, ``prompts_down`` and ``p_sign``; absent
            in evidence recorded before they were kept: not checked); fewer prompts
            answered than there are validation prompts the model was not trained on is
            refused, and so is a verdict in :data:`REFUSED_VERDICTS`.
        metric: The metric the candidate must beat the reference on (over all prompts).
        guards: ``{guard: tolerance}`` (see the module docstring).
        min_prompts: The fewest prompts the metric's comparison must rest on.

    Raises:
        KeyError: When eval has no comparison for ``metric`` or a guard (the caller names
            the parameter).
    """
    reference = evidence["reference"]
    main = evidence["overall"].get(metric)
    if main is None:
        raise KeyError(metric)
    used = {metric: main}
    reasons = []
    # Beyond noise: the interval excludes 0 and the sign test of the prompts that changed
    # agrees (significance.py; evidence recorded before the sign test: the interval alone).
    signs_agree = main.get("distinguishable", True)
    up, down = main["ci_low"] > 0 and signs_agree, main["ci_high"] < 0 and signs_agree
    lower_is_better = metric in LOWER_IS_BETTER
    beats = down if lower_is_better else up
    better = " (lower is better)" if lower_is_better else ""
    if up or down:
        verdict = f"{'up' if up else 'down'} beyond the paired 95% interval{better}"
    elif main["ci_low"] > 0 or main["ci_high"] < 0:
        verdict = f"the interval excludes 0, but {signs_disagree(main)}"
    else:
        verdict = (f"not {'down' if lower_is_better else 'up'} beyond the paired 95% "
                   "interval (the interval reaches 0)")
    reasons.append(f"{metric}: {_change(main)} vs {reference}: {verdict}")
    compared = main.get("prompts")
    few = compared is not None and compared < min_prompts
    if few:
        reasons.append(f"the comparison with {reference} rests on {compared} prompts, fewer "
                       f"than promote.min_prompts={min_prompts}: no evidence for the gate"
                       + ("; the champion answered only the validation prompts it was not "
                          "trained on" if reference.startswith("champion") else ""))
    failed = []
    for guard, tolerance in guards.items():
        comparison = guard_comparison(evidence, guard)
        if comparison is None:
            raise KeyError(guard)
        used[guard] = comparison
        name = guard.rpartition(":")[2]
        # Worse beyond noise too: the rule the metric's gain is held to.
        beyond_noise = comparison.get("distinguishable", True)
        if name in LOWER_IS_BETTER:
            worse = beyond_noise and comparison["ci_low"] > tolerance
            rule = f"must not rise beyond {tolerance:g}"
        else:
            worse = beyond_noise and comparison["ci_high"] < -tolerance
            rule = f"must not fall beyond {tolerance:g}"
        if worse:
            failed.append(guard)
        reasons.append(f"guard {guard}: {_change(comparison)} ({rule}): "
                       + ("worse beyond its tolerance" if worse else "within"))
    # The gate's metric and guards against the reference do not see what the verdict
    # against the base model does: a headline up while no correctness metric is (format
    # farming) is "reward hacking suspected", with every degeneration rate flat.
    verdict = evidence.get("verdict")  # evidence recorded before it: not known
    suspect = verdict in REFUSED_VERDICTS
    if suspect:
        reasons.append(f"eval's verdict against the base model: {verdict}; the gate promotes "
                       "no such model (the eval report says why)")
    # Evidence recorded before eval counted its prompts answered every one of them.
    answered, of = evidence.get("prompts"), evidence.get("validation_prompts")
    quick = answered is not None and of is not None and answered < of
    if quick:
        unseen = " the model was not trained on" if evidence.get("trained_on_prompts") else ""
        reasons.append(f"eval answered {answered} of the {of} validation prompts{unseen} "
                       "(eval.max_prompts, a quick check): no evidence for the gate; run eval "
                       "with eval.max_prompts unset (null)")
    promote = beats and not failed and not quick and not suspect and not few
    return Decision(promote, reasons, used)


def _change(c: dict[str, Any]) -> str:
    return f"{c['delta']:+.3g} [{c['ci_low']:+.3g}, {c['ci_high']:+.3g}]"
