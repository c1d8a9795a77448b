"""The promotion gate on paired intervals: cases decided by hand."""

from __future__ import annotations

import pytest

from rl_pipeline.evaluation.promotion import decide_promotion


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
