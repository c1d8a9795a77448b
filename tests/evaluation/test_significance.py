"""The paired bootstrap: it covers a known difference, stays wide where 32 prompts cannot
tell, pairs the models, and the prompts-needed estimate follows its formula."""

from __future__ import annotations

import numpy as np
import pytest

from rl_pipeline.evaluation.significance import (
    bootstrap_interval,
    paired_comparison,
    prompts_needed,
    resampled_means,
)


def test_interval_covers_a_known_difference_about_95_percent_of_the_time() -> None:
    """Populations with a known difference: base right with p=0.4; trained keeps a right
    answer with p=0.9 and fixes a wrong one with p=0.3, so it is right with p=0.54 and the
    true difference is 0.14. Over 300 evals of 200 prompts the interval holds it about 95% of
    the time, and at this size it excludes 0 most of the time."""
    rng = np.random.default_rng(0)
    true_delta = 0.4 * 0.9 + 0.6 * 0.3 - 0.4
    covered = distinguished = 0
    for trial in range(300):
        base = rng.random(200) < 0.4
        trained = np.where(base, rng.random(200) < 0.9, rng.random(200) < 0.3)
        c = paired_comparison(base, trained, resamples=2000, seed=trial)
        covered += c["ci_low"] <= true_delta <= c["ci_high"]
        distinguished += c["distinguishable"]
    assert 0.91 <= covered / 300 <= 0.99
    assert distinguished / 300 > 0.8


def test_a_fixed_known_difference_is_inside_and_zero_outside() -> None:
    base = np.zeros(400)
    base[:120] = 1
    trained = base.copy()
    trained[120:200] = 1  # 80 more prompts right: +0.2 exactly, nothing lost
    c = paired_comparison(base, trained)
    assert c["delta"] == pytest.approx(0.2)
    assert c["ci_low"] < 0.2 < c["ci_high"] and c["ci_low"] > 0 and c["distinguishable"]


def test_32_prompts_of_equal_score_give_a_wide_interval_around_0() -> None:
    # Both right on 16 of 32 prompts, half of them different prompts: no difference, and
    # per-prompt changes of +-1 on 16 prompts.
    base = np.array([1] * 16 + [0] * 16, dtype=float)
    trained = np.array([0] * 8 + [1] * 16 + [0] * 8, dtype=float)
    c = paired_comparison(base, trained)
    assert c["delta"] == 0 and c["ci_low"] < 0 < c["ci_high"]
    assert c["ci_high"] - c["ci_low"] > 0.3  # se = sd/sqrt(32) = 0.127: about +-0.25
    assert not c["distinguishable"] and c["prompts_needed"] is None
    # Two more prompts right out of 32 is not distinguishable either; the estimate says
    # how many prompts a difference of 1/16 would need.
    trained[24:26] = 1
    c = paired_comparison(base, trained)
    assert c["delta"] == pytest.approx(1 / 16) and not c["distinguishable"]
    sd = np.std(trained - base, ddof=1)
    assert c["prompts_needed"] == int(np.ceil((1.959964 * sd * 16) ** 2))
    assert c["prompts_needed"] > 32


def test_the_same_seed_resamples_the_same_prompts_for_both_models() -> None:
    rng = np.random.default_rng(1)
    base, trained = rng.random(50), rng.random(50)
    diff = resampled_means(trained - base, resamples=500, seed=7)
    # Paired: one draw of prompts for both models.
    assert np.allclose(resampled_means(trained, 500, 7) - resampled_means(base, 500, 7), diff)
    assert paired_comparison(base, trained, 500, 7) == paired_comparison(base, trained, 500, 7)
    low, high = bootstrap_interval(trained - base, 500, 7)
    c = paired_comparison(base, trained, 500, 7)
    assert (c["ci_low"], c["ci_high"]) == (low, high)


def test_prompts_needed_formula() -> None:
    assert prompts_needed(0.1, 0.5) == 97  # (1.96 * 0.5 / 0.1)^2 = 96.04
    assert prompts_needed(-0.1, 0.5, power=0.8) == 197  # ((1.96 + 0.84) * 5)^2 = 196.2
    assert prompts_needed(0.0, 0.5) is None
    assert prompts_needed(0.2, 0.0) == 1  # every prompt moved the same: one shows it


def test_paired_comparison_refuses_unpaired_scores() -> None:
    with pytest.raises(ValueError, match="one value per prompt"):
        paired_comparison(np.zeros(3), np.zeros(4))


def test_one_prompt_is_no_evidence_of_a_difference() -> None:
    """One prompt's difference is its own interval ([+1, +1]): not distinguishable."""
    one = paired_comparison(np.zeros(1), np.ones(1))
    assert (one["ci_low"], one["ci_high"], one["distinguishable"]) == (1.0, 1.0, False)
    assert paired_comparison(np.zeros(8), np.ones(8))["distinguishable"]


@pytest.mark.parametrize("prompts", [20, 1000])
def test_four_prompts_that_gained_are_not_beyond_noise_however_many_did_not_change(
        prompts) -> None:
    """The percentile interval excludes 0 as soon as fewer than 2.5% of resamples miss every
    changed prompt (4 of any number); the exact sign test of 4 of 4 gives p = 0.125."""
    base, trained = np.zeros(prompts), np.zeros(prompts)
    trained[:4] = 1
    four = paired_comparison(base, trained)
    assert four["ci_low"] > 0  # the interval alone would call it real
    assert (four["prompts_up"], four["prompts_down"]) == (4, 0)
    assert four["p_sign"] == pytest.approx(0.125)
    assert not four["distinguishable"]
    trained[:6] = 1  # 6 of 6: p = 0.031
    assert paired_comparison(base, trained)["distinguishable"]
    trained[6:11] = -1  # 6 up, 5 down: p = 1
    assert not paired_comparison(base, trained)["distinguishable"]


def test_a_mean_carried_by_a_few_prompts_against_most_is_not_beyond_noise() -> None:
    """Partial credit: 30 prompts gain 0.8, 120 lose 0.1: the mean rises (+0.06, its interval
    above 0) while most prompts fell, significantly so by their signs. Neither direction is
    evidence of a better model."""
    base = np.full(200, 0.2)
    trained = base.copy()
    trained[:30] += 0.8
    trained[30:150] -= 0.1
    mixed = paired_comparison(base, trained)
    assert mixed["delta"] > 0 and mixed["ci_low"] > 0
    assert mixed["p_sign"] < 0.05 and mixed["prompts_down"] > mixed["prompts_up"]
    assert not mixed["distinguishable"]
