"""GSM8K's strict and flexible scores (lm-evaluation-harness semantics) against verl's own
scorer, ``verl.utils.reward_score.gsm8k.compute_score``, on the same responses."""

from __future__ import annotations

import pytest
from verl.utils.reward_score import gsm8k as verl_gsm8k

from rl_pipeline.evaluation.gsm8k import (
    flexible_extract,
    flexible_score,
    is_gsm8k_source,
    normalise,
    strict_match,
    strict_score,
)
from tests.conftest import read_gsm8k


def _responses() -> list[tuple[str, str]]:
    """(response, ground truth): GSM8K's reference solutions scored against their own answer,
    against another record's, and with the '#### ' line cut off (flexible only can read it)."""
    records = read_gsm8k(n=400)
    truths = [r["answer"].split("#### ")[-1].replace(",", "") for r in records]
    out = []
    for i, record in enumerate(records):
        solution = record["answer"]
        out += [(solution, truths[i]), (solution, truths[i - 1]),
                (solution.split("####")[0], truths[i])]
    return out


def test_strict_equals_verls_strict_mode_on_the_same_responses() -> None:
    pairs = _responses()
    ours = [strict_score(r, t) for r, t in pairs]
    verl = [float(verl_gsm8k.compute_score(r, t, method="strict")) for r, t in pairs]
    assert ours == verl
    assert 0 < sum(ours) < len(ours)  # both outcomes occur


def test_flexible_equals_verls_flexible_mode_with_lm_evals_exact_match() -> None:
    """Both take the last number; verl compares it raw, lm-eval after deleting ',', '$' and a
    trailing '.'. So ours equals verl's score wherever the raw number needs no clean-up,
    and equals verl's extraction under lm-eval's exact_match everywhere."""
    pairs = _responses()
    raw_same = 0
    for response, truth in pairs:
        ours = flexible_score(response, truth)
        verl_answer = verl_gsm8k.extract_solution(response, method="flexible")
        assert ours == float(verl_answer is not None
                             and normalise(verl_answer) == normalise(truth)), response[-80:]
        if verl_answer == normalise(verl_answer or ""):
            raw_same += 1
            assert ours == float(verl_gsm8k.compute_score(response, truth, method="flexible"))
    assert raw_same > len(pairs) // 2


@pytest.mark.parametrize(("response", "truth", "mode", "ours", "verl"), [
    # lm-eval's exact_match deletes a trailing period, commas and dollar signs; verl's
    # flexible mode compares the raw match.
    ("The answer is 72.", "72", "flexible", 1.0, 0),
    ("It costs $1,000", "1000", "flexible", 1.0, 0),
    ("#### 1,000.", "1000", "strict", 1.0, 0),
    # strict-match takes the first '#### ' answer (take_first), verl the last.
    ("#### 7\nOr rather #### 8", "7", "strict", 1.0, 0),
    # verl reads the last 300 characters only.
    ("#### 72\n" + "and that is all. " * 20, "72", "strict", 1.0, 0),
])
def test_where_lm_eval_semantics_and_verl_differ(response, truth, mode, ours, verl) -> None:
    score = strict_score if mode == "strict" else flexible_score
    assert score(response, truth) == ours
    assert verl_gsm8k.compute_score(response, truth, method=mode) == verl


def test_extraction_follows_lm_eval_filters() -> None:
    assert strict_match("so #### -3,5.") == "-35"
    assert strict_match("the answer is 5") is None
    assert flexible_extract("3 apples and $4.50.") == "4.50"
    assert flexible_extract("just 7") == "7"
    assert flexible_extract("no digits") is None
    assert is_gsm8k_source("openai/gsm8k") and not is_gsm8k_source("lighteval/MATH")
