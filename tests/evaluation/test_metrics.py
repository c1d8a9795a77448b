"""pass@k against a reference computation; maj@k, mean@n and the per-model metrics against
values computed by hand."""

from __future__ import annotations

import itertools
import math
from math import comb

import pandas as pd
import pytest

from rl_pipeline.evaluation.metrics import (
    majority_vote,
    model_metrics,
    pass_at_k,
    per_prompt_scores,
    usable_k,
)


@pytest.mark.parametrize(("n", "c"), [(1, 0), (1, 1), (5, 0), (5, 2), (10, 3), (10, 10),
                                      (20, 1), (50, 7)])
def test_pass_at_k_equals_the_combinatorial_definition(n: int, c: int) -> None:
    for k in range(1, n + 1):
        reference = 1 - comb(n - c, k) / comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(reference, abs=1e-12)


def test_pass_at_k_is_the_chance_that_a_random_k_subset_holds_a_correct_sample() -> None:
    samples = [1, 0, 0, 1, 0, 0]  # n = 6, c = 2
    for k in range(1, 7):
        subsets = list(itertools.combinations(samples, k))
        exact = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(6, 2, k) == pytest.approx(exact)
    # Not best-of-k over the first k samples: that would give 1.0 for k=1 here.
    assert pass_at_k(6, 2, 1) == pytest.approx(2 / 6)


def test_pass_at_k_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_vote_counts_answers_and_breaks_ties_by_first_appearance() -> None:
    assert majority_vote(["5", "6", "6"], [False, True, True])
    assert not majority_vote(["5", "6", "5"], [False, True, False])
    # A tie goes to the answer given first ("9"), though "8" is right: deterministic.
    assert not majority_vote(["9", "8", "8", "9"], [False, True, True, False])
    assert majority_vote(["8", "9", "9", "8"], [True, False, False, True])
    # No answer does not vote; no answer at all fails.
    assert majority_vote([None, None, "3"], [False, False, True])
    assert not majority_vote([None, None], [True, True])


def test_a_hedged_gsm8k_answer_casts_no_vote() -> None:
    """"#### 5 ... #### 7" voted 5 (strict-match's first answer) with the reward that 7 (the
    reward's last) earned: the wrong majority answer 5 counted as right."""
    from rl_pipeline.evaluation.answers import extract_answer

    assert extract_answer("openai/gsm8k", "So 2 + 3.\n#### 5\nNo: 3 + 4.\n#### 7") is None
    assert extract_answer("openai/gsm8k", "#### 7\nso #### 7.") == "7"  # the same twice
    responses = ["#### 5\n#### 7", "#### 5", "#### 5", "#### 7"]
    answers = [extract_answer("openai/gsm8k", r) for r in responses]
    assert answers == [None, "5", "5", "7"]
    assert not majority_vote(answers, [True, False, False, True])


def test_usable_k_skips_k_above_the_samples() -> None:
    assert usable_k([8, 1, 4, 4], 4) == ([1, 4], [8])
    assert usable_k([4], 1) == ([1], [4])  # pass@1 always: the verdict's correctness


def _frame() -> pd.DataFrame:
    """Three prompts x 4 samples: two GSM8K, one MATH (no strict/flexible there)."""
    rows = [
        # prompt 0: correct, wrong, correct, wrong; answers tie 2-2, "72" first.
        (0, "openai/gsm8k", [1.0, 0.0, 1.0, 0.0], ["72", "70", "72", "70"], [1, 0, 1, 0],
         [1, 1, 1, 0], [1, 0, 1, 1]),
        # prompt 1: one correct sample (0.1: format credit, not correct); "5" wins the vote.
        (1, "openai/gsm8k", [0.1, 1.0, 0.1, 0.0], ["5", "6", "5", None], [0, 1, 0, 0],
         [0, 1, 0, 0], [1, 1, 1, 0]),
        # prompt 2: MATH, correct answer "8" loses the tie to "9", given first.
        (2, "lighteval/MATH", [0.0, 1.0, 1.0, 0.0], ["9", "8", "8", "9"], [None] * 4,
         [None] * 4, [None] * 4),
    ]
    records = []
    for prompt, source, rewards, answers, strict, flexible, formatted in rows:
        for s in range(4):
            records.append({
                "prompt_index": prompt, "sample_index": s, "data_source": source,
                "reward": rewards[s], "answer": answers[s],
                "strict": math.nan if strict[s] is None else float(strict[s]),
                "flexible": math.nan if flexible[s] is None else float(flexible[s]),
                "strict_format": math.nan if formatted[s] is None else float(formatted[s]),
                "response_tokens": 10 * (prompt + 1), "truncated": prompt == 2 and s == 3,
                "repetitive": prompt == 1 and s < 2, "no_reasoning": s == 0})
    return pd.DataFrame(records).sample(frac=1, random_state=0)  # any row order


def test_per_prompt_scores_by_hand() -> None:
    scores = per_prompt_scores(_frame(), pass_k=[1, 2, 4, 8])
    assert "pass_at_8" not in scores  # 4 samples per prompt
    assert list(scores["mean_reward"]) == pytest.approx([0.5, 0.3, 0.5])
    # pass@1 = c/n; pass@2 = 1 - C(n-c,2)/C(n,2): prompt 0 1-1/6, prompt 1 1-3/6, prompt 2 1-1/6
    assert list(scores["pass_at_1"]) == pytest.approx([0.5, 0.25, 0.5])
    assert list(scores["pass_at_2"]) == pytest.approx([5 / 6, 0.5, 5 / 6])
    assert list(scores["pass_at_4"]) == [1.0, 1.0, 1.0]
    # maj@1: the first sample; maj@2: prompt 2 ties "9" vs "8" -> "9" (wrong);
    # maj@4: prompt 0 ties "72" vs "70" -> "72" (right), prompt 1 "5" (wrong).
    assert list(scores["maj_at_1"]) == [1.0, 0.0, 0.0]
    assert list(scores["maj_at_2"]) == [1.0, 0.0, 0.0]
    assert list(scores["maj_at_4"]) == [1.0, 0.0, 0.0]
    assert list(scores["strict_accuracy"][:2]) == [0.5, 0.25]
    assert math.isnan(scores["strict_accuracy"].iloc[2])
    assert list(scores["flexible_pass_at_2"][:2]) == pytest.approx([1.0, 0.5])
    # A strict-match answer in 3 of 4 samples of each GSM8K prompt, right or wrong.
    assert list(scores["strict_format_rate"][:2]) == [0.75, 0.75]
    assert math.isnan(scores["strict_format_rate"].iloc[2])


def test_model_metrics_by_hand() -> None:
    frame = _frame()
    frame["reward_error"] = [True] + [False] * (len(frame) - 1)
    m = model_metrics(frame, pass_k=[1, 4, 8], resamples=1000)
    assert m["mean_reward"] == pytest.approx((0.5 + 0.3 + 0.5) / 3)
    assert m["mean_at_4"] == m["mean_reward"]  # mean@n: the mean of per-sample scores
    assert m["pass_at_1"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert m["pass_at_4"] == 1.0 and "pass_at_8" not in m
    assert m["maj_at_1"] == pytest.approx(1 / 3) and m["maj_at_4"] == pytest.approx(1 / 3)
    # strict and flexible over the two GSM8K prompts only.
    assert m["strict_accuracy"] == pytest.approx(0.375) and m["gsm8k_prompts"] == 2
    assert m["flexible_accuracy"] == pytest.approx(0.5)
    assert m["strict_pass_at_4"] == 1.0 and m["strict_format_rate"] == 0.75
    assert m["mean_reward_ci_low"] <= m["mean_reward"] <= m["mean_reward_ci_high"]
    assert (m["prompts"], m["samples_per_prompt"], m["reward_errors"], m["reward_timeouts"]) \
        == (3, 4, 1, 0)
    assert m["mean_response_tokens"] == 20 and m["truncation_rate"] == pytest.approx(1 / 12)
    assert m["repetition_rate"] == pytest.approx(2 / 12)
    assert m["no_reasoning_rate"] == pytest.approx(3 / 12)
    gsm8k = m["by_data_source"]["openai/gsm8k"]
    assert (gsm8k["repetition_rate"], gsm8k["truncation_rate"]) == (0.25, 0.0)
    math_source = m["by_data_source"]["lighteval/MATH"]
    assert math_source["mean_reward"] == 0.5 and math_source["strict_accuracy"] is None
    assert math_source["maj_at_4"] == 0.0 and math_source["pass_at_1"] == 0.5
    assert m["by_data_source"]["openai/gsm8k"]["pass_at_1"] == pytest.approx(0.375)
