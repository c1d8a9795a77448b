"""pass@k against a reference computation, and the per-model metrics."""

from __future__ import annotations

import itertools
from math import comb

import pandas as pd
import pytest

from rl_pipeline.evaluation.metrics import model_metrics, pass_at_k


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


def test_model_metrics_on_known_generations() -> None:
    # Two prompts x 4 samples; prompt 0 strict-correct twice, prompt 1 never.
    strict = [1, 1, 0, 0, 0, 0, 0, 0]
    flexible = [1, 1, 1, 0, 1, 0, 0, 0]
    frame = pd.DataFrame({
        "prompt_index": [0] * 4 + [1] * 4, "sample_index": list(range(4)) * 2,
        "data_source": ["openai/gsm8k"] * 4 + ["other"] * 4,
        "strict": [bool(s) for s in strict], "flexible": [bool(f) for f in flexible],
        "reward": [float(s) for s in strict],
        "response_tokens": [10, 20, 30, 40, 50, 60, 70, 80],
        "truncated": [False] * 7 + [True],
    })
    m = model_metrics(frame, reward_errors=1)
    assert m["strict_accuracy"] == 0.25 and m["flexible_accuracy"] == 0.5
    assert m["mean_reward"] == 0.25 and m["reward_errors"] == 1
    assert m["mean_response_tokens"] == 45 and m["truncation_rate"] == 0.125
    assert m["samples_per_prompt"] == 4
    assert m["strict_pass_at_1"] == pytest.approx((pass_at_k(4, 2, 1) + 0) / 2)
    assert m["strict_pass_at_4"] == pytest.approx(0.5)
    assert m["flexible_pass_at_2"] == pytest.approx((pass_at_k(4, 3, 2) + pass_at_k(4, 1, 2)) / 2)
    assert set(m["by_data_source"]) == {"openai/gsm8k", "other"}
    assert m["by_data_source"]["openai/gsm8k"]["strict_accuracy"] == 0.5
