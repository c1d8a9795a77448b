"""The promotion gate on paired intervals: cases decided by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rl_pipeline.evaluation.promotion import decide_promotion, unknown_gate_metrics
from rl_pipeline.evaluation.significance import paired_comparison


def _c(delta: float, low: float, high: float) -> dict[str, float]:
    return {"delta": delta, "ci_low": low, "ci_high": high}


def _evidence(**overall) -> dict:
    return {"reference": "champion:1", "overall": overall,
            "by_data_source": {"openai/gsm8k": {"strict_accuracy": _c(-0.05, -0.09, -0.01)}}}


NO_GUARDS: dict[str, float] = {}


def test_a_gain_beyond_the_interval_is_promoted() -> None:
    decision = decide_promotion(_evidence(mean_reward=_c(0.10, 0.04, 0.16)), "mean_reward",
                                NO_GUARDS)
    assert decision.promote
    assert decision.reasons == ["mean_reward: +0.1 [+0.04, +0.16] vs champion:1: up beyond "
                                "the paired 95% interval"]


@pytest.mark.parametrize("low", [0.0, -0.01])
def test_a_gain_whose_interval_reaches_zero_is_refused_as_noise(low) -> None:
    decision = decide_promotion(_evidence(mean_reward=_c(0.08, low, 0.17)), "mean_reward",
                                NO_GUARDS)
    assert not decision.promote
    assert decision.reasons[0].endswith("not up beyond the paired 95% interval (the interval "
                                        "reaches 0)")


def test_a_loss_beyond_the_interval_is_refused_as_a_loss() -> None:
    decision = decide_promotion(_evidence(mean_reward=_c(-0.35, -0.435, -0.265)),
                                "mean_reward", NO_GUARDS)
    assert not decision.promote
    assert decision.reasons == ["mean_reward: -0.35 [-0.435, -0.265] vs champion:1: down "
                                "beyond the paired 95% interval"]


def test_a_metric_that_is_better_lower_must_fall_beyond_its_interval() -> None:
    """promote.metric=mean_response_tokens promoted a model whose answers grew 85 tokens."""
    longer = decide_promotion(_evidence(mean_response_tokens=_c(85, 60, 110)),
                              "mean_response_tokens", NO_GUARDS)
    assert not longer.promote
    assert longer.reasons == ["mean_response_tokens: +85 [+60, +110] vs champion:1: up beyond "
                              "the paired 95% interval (lower is better)"]
    fewer = decide_promotion(_evidence(truncation_rate=_c(-0.1, -0.15, -0.05)),
                             "truncation_rate", NO_GUARDS)
    assert fewer.promote
    assert fewer.reasons[0].endswith("down beyond the paired 95% interval (lower is better)")
    noise = decide_promotion(_evidence(truncation_rate=_c(-0.1, -0.2, 0.01)),
                             "truncation_rate", NO_GUARDS)
    assert not noise.promote
    assert noise.reasons[0].endswith("not down beyond the paired 95% interval (the interval "
                                     "reaches 0)")


def test_a_comparison_on_too_few_prompts_is_no_evidence() -> None:
    """A champion that answered one prompt (the only validation prompt it had not trained
    on) lost it: +1 [+1, +1], and the gate promoted on that one prompt."""
    one = {**_c(1.0, 1.0, 1.0), "prompts": 1}
    refused = decide_promotion(_evidence(mean_reward=one), "mean_reward", NO_GUARDS)
    assert not refused.promote
    assert refused.reasons[1] == (
        "the comparison with champion:1 rests on 1 prompts, fewer than promote.min_prompts=20:"
        " no evidence for the gate; the champion answered only the validation prompts it was "
        "not trained on")
    enough = {**_c(0.2, 0.1, 0.3), "prompts": 20}
    assert decide_promotion(_evidence(mean_reward=enough), "mean_reward", NO_GUARDS).promote
    assert not decide_promotion(_evidence(mean_reward=enough), "mean_reward", NO_GUARDS,
                                min_prompts=21).promote


def test_a_rate_that_rises_beyond_its_tolerance_blocks_the_gain() -> None:
    evidence = _evidence(mean_reward=_c(0.10, 0.04, 0.16),
                         truncation_rate=_c(0.06, 0.03, 0.09))
    assert not decide_promotion(evidence, "mean_reward", {"truncation_rate": 0.0}).promote
    # Within a tolerance of 0.05: the interval's low end (0.03) is not above it.
    within = decide_promotion(evidence, "mean_reward", {"truncation_rate": 0.05})
    assert within.promote
    assert within.reasons[1] == ("guard truncation_rate: +0.06 [+0.03, +0.09] (must not rise "
                                 "beyond 0.05): within")


def test_a_data_source_guard_that_falls_blocks_the_gain() -> None:
    evidence = _evidence(mean_reward=_c(0.10, 0.04, 0.16))
    refused = decide_promotion(evidence, "mean_reward", {"openai/gsm8k:strict_accuracy": 0.0})
    assert not refused.promote
    assert "worse beyond its tolerance" in refused.reasons[1]
    # A fall of at most 0.02 is tolerated: the interval's high end (-0.01) is not below -0.02.
    assert decide_promotion(evidence, "mean_reward",
                            {"openai/gsm8k:strict_accuracy": 0.02}).promote


def test_an_unknown_metric_or_guard_is_a_key_error() -> None:
    evidence = _evidence(mean_reward=_c(0.10, 0.04, 0.16))
    with pytest.raises(KeyError):
        decide_promotion(evidence, "strict_accuracy", NO_GUARDS)
    with pytest.raises(KeyError):
        decide_promotion(evidence, "mean_reward", {"other/source:pass_at_1": 0.0})


def _scored(samples: int, pass_k: list[int], seed: int):
    """per_prompt_scores of 6 GSM8K-style prompts, ``samples`` answers each."""
    import numpy as np
    import pandas as pd

    from rl_pipeline.evaluation.metrics import per_prompt_scores

    rng = np.random.default_rng(seed)
    rows = [{"prompt_index": p, "sample_index": s, "data_source": "openai/gsm8k",
             "reward": float(right), "strict": float(right), "flexible": float(right),
             "strict_format": 1.0, "answer": str(int(right)), "response_tokens": 9,
             "truncated": False, "repetitive": False, "no_reasoning": False}
            for p in range(6) for s in range(samples) for right in [rng.random() < 0.5]]
    return per_prompt_scores(pd.DataFrame(rows), pass_k)


@pytest.mark.parametrize(("samples", "pass_k"), [(1, [1, 4, 8]), (4, [1, 4, 8]), (8, [2])])
def test_the_gate_knows_before_any_stage_the_metrics_eval_will_compare(samples, pass_k) -> None:
    from rl_pipeline.evaluation.metrics import comparable_metrics, compare_models

    compared = compare_models(_scored(samples, pass_k, 0), _scored(samples, pass_k, 1),
                              resamples=100, seed=0)
    known = comparable_metrics(samples, pass_k)
    assert set(known) == {m for m, c in compared.items() if isinstance(c, dict)
                          and "ci_low" in c}
    assert unknown_gate_metrics("mean_reward", {"truncation_rate": 0.0,
                                                "openai/gsm8k:strict_accuracy": 0.0},
                                samples, pass_k) == []
    assert ("pass_at_4" in known) == (samples >= 4 and 4 in pass_k)


def test_a_gate_metric_eval_will_not_compare_is_named_with_those_it_will() -> None:
    problems = unknown_gate_metrics("pass_at_4", {"truncaton_rate": 0.0,
                                                  "openai/gsm8k:strict_acc": 0.1}, 1, [1, 4])
    assert len(problems) == 3
    assert problems[0].startswith("promote.metric='pass_at_4': eval compares mean_reward, "
                                  "pass_at_1, ")
    assert "need eval.n_samples of k or more and eval.greedy false" in problems[0]
    assert problems[1].startswith("promote.guards.truncaton_rate: eval compares ")
    assert problems[2].startswith("promote.guards.openai/gsm8k:strict_acc: eval compares ")
    assert unknown_gate_metrics("pass_at_4", {}, 4, [1, 4]) == []


def test_a_headline_gain_eval_calls_reward_hacking_is_refused_with_guards_flat() -> None:
    """Format farming: the reward up, no correctness metric up, no degeneration rate up.
    The gate's metric and guards all pass; eval's verdict against the base does not."""
    from rl_pipeline.evaluation.metrics import DEGENERATION
    from rl_pipeline.evaluation.verdict import GSM8K_CORRECTNESS, decide

    compared = {"mean_reward": _c(0.08, 0.05, 0.11),
                **{m: _c(0.0, -0.03, 0.03) for m in GSM8K_CORRECTNESS},
                **{m: _c(0.0, 0.0, 0.0) for m in DEGENERATION}}
    verdict = decide(compared, GSM8K_CORRECTNESS).verdict
    assert verdict == "reward hacking suspected"
    guards = {m: 0.0 for m in DEGENERATION}
    evidence = {**_evidence(**compared), "reference": "base"}
    assert decide_promotion(evidence, "mean_reward", guards).promote  # before the verdict
    refused = decide_promotion({**evidence, "verdict": verdict}, "mean_reward", guards)
    assert not refused.promote and refused.reasons[-1] == (
        "eval's verdict against the base model: reward hacking suspected; the gate promotes "
        "no such model (the eval report says why)")
    assert decide_promotion({**evidence, "verdict": "learned"}, "mean_reward", guards).promote


def test_four_prompts_that_gained_out_of_a_thousand_promote_nothing() -> None:
    """The interval of 4 gains among 1,000 prompts excludes 0 ([+0.001, +0.008]); the sign
    test of those 4 does not (p = 0.125): the gate says so and refuses."""
    reference, candidate = np.zeros(1000), np.zeros(1000)
    candidate[:4] = 1
    compared = paired_comparison(reference, candidate)
    assert compared["ci_low"] > 0
    decision = decide_promotion(_evidence(strict_accuracy=compared), "strict_accuracy",
                                NO_GUARDS)
    assert not decision.promote
    assert ("the interval excludes 0, but 4 prompt(s) scored higher and 0 lower (exact sign "
            "test p = 0.12): too few changed to tell from noise") in decision.reasons[0]
    candidate[:30] = 1
    assert decide_promotion(_evidence(strict_accuracy=paired_comparison(reference, candidate)),
                            "strict_accuracy", NO_GUARDS).promote


def test_a_guard_worse_on_four_prompts_of_a_thousand_is_noise_not_a_refusal() -> None:
    """A guard is held to the rule the metric is: truncation up on 4 of 1,000 prompts has an
    interval above 0 and a sign test of p = 0.125."""
    reference, candidate = np.zeros(1000), np.zeros(1000)
    candidate[:4] = 1
    truncation = paired_comparison(reference, candidate)
    assert truncation["ci_low"] > 0 and not truncation["distinguishable"]
    gain = paired_comparison(np.zeros(1000), np.r_[np.ones(100), np.zeros(900)])
    decision = decide_promotion(_evidence(mean_reward=gain, truncation_rate=truncation),
                                "mean_reward", {"truncation_rate": 0.0})
    assert decision.promote, decision.reasons
    assert decision.reasons[1].endswith("(must not rise beyond 0): within")


def test_a_mean_most_prompts_contradict_is_said_to_be_so() -> None:
    base = np.full(200, 0.2)
    trained = base.copy()
    trained[:30] += 0.8
    trained[30:150] -= 0.1
    decision = decide_promotion(_evidence(mean_reward=paired_comparison(base, trained)),
                                "mean_reward", NO_GUARDS)
    assert not decision.promote
    assert ("the interval excludes 0, but 30 prompt(s) scored higher and 120 lower (exact "
            "sign test p = 6e-14): most changed prompts went the other way") in \
        decision.reasons[0]
