"""GSM8K's strict and flexible scores (lm-evaluation-harness semantics): strict-match on cases
scored by hand, flexible-extract against verl's own extraction on GSM8K's solutions."""

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


# Scored by hand against the reference 72, by lm-evaluation-harness's gsm8k strict-match: the
# first "#### <number>", then exact_match after deleting ",", "$", up to "#### " and one
# trailing ".".
STRICT_BY_HAND = [
    ("48 + 24 = 72 altogether.\n#### 72", 1.0),
    ("#### 72.", 1.0),  # one trailing "." is deleted
    ("#### 72.0", 0.0),  # compared as text
    ("#### 7,2", 1.0),  # "," is deleted
    ("#### -72", 0.0),
    ("#### 72\n#### 71", 1.0),  # the first answer counts (verl's training score: the last)
    ("#### 71\n#### 72", 0.0),
    ("#### $72", 0.0),  # "$" is not in the strict pattern
    ("####72", 0.0),
    ("The answer is 72.", 0.0),  # flexible-extract reads it; strict-match does not
    ("#### 72\n" + "x" * 400, 1.0),  # no window: verl's training score would give 0
]


@pytest.mark.parametrize(("response", "score"), STRICT_BY_HAND)
def test_strict_scores_as_scored_by_hand(response: str, score: float) -> None:
    assert strict_score(response, "72") == score


def test_strict_reads_the_reference_as_exact_match_does() -> None:
    assert strict_score("#### 1000", "1,000") == 1.0
    assert strict_score("#### 1,000.", "1000") == 1.0
    assert strict_score("#### 72", "$72") == 1.0


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
