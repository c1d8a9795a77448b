"""The form of a response: final answers, repetition, reasoning, truncation, on hand-written
responses and on GSM8K's own reference solutions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_pipeline.rewards.form import (
    final_answers,
    form,
    has_no_reasoning,
    is_repetitive,
    ngram_repeat_share,
    repeated_line,
    response_facts,
)

GSM8K = Path(__file__).resolve().parents[2] / "data" / "01_raw" / "gsm8k"


@pytest.mark.parametrize("response", [
    "#### 10\n#### 10\n#### 10\n#### 10",  # the farmed answer: one line, again and again
    "#### 10 #### 10 #### 10 #### 10 #### 10 #### 10 #### 10 #### 10 #### 10 #### 10",
    "The answer is 10. " * 10,  # a loop within one line
    "13 + 71 = 13 + 71 = 13 + 71 = 13 + 71 = 13 + 71 = 13 + 71 = 13 + 71 = ",
])
def test_loops_are_repetitive(response: str) -> None:
    assert is_repetitive(response)


@pytest.mark.parametrize("response", [
    "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day.\n#### 18",
    "57 + 26 = 83\n#### 83",
    "#### 10",  # short: nothing repeats
    "= 5\n= 5\nSo 10.",  # a line twice is not a loop
    # Markup a MATH or code answer repeats by form: it flagged such answers as repetitive.
    "First\n\\[\nx = 1\n\\]\nthen\n\\[\ny = 2\n\\]\nso\n\\[\nz = 3\n\\]\n\\boxed{3}",
    "```python\nf(1)\n```\nand\n```python\nf(2)\n```\nor\n```python\nf(3)\n```",
])
def test_ordinary_answers_are_not(response: str) -> None:
    assert not is_repetitive(response)


def test_the_rules_measured_on_hand_written_text() -> None:
    assert repeated_line("a\n b \na\nb\na") == "a"  # three times, stripped
    assert repeated_line("a\nb\na") is None
    assert ngram_repeat_share("one two three four") == 0.0  # too few 4-grams to tell
    assert ngram_repeat_share("x y " * 10) == pytest.approx(1 - 2 / 17)


def test_no_gsm8k_reference_solution_is_repetitive_or_unanswered() -> None:
    """The repetition rules were set on GSM8K's 8,792 reference solutions (train and test):
    their templated steps reach an n-gram repeat share of 0.31, below the 0.5 limit."""
    answers = [json.loads(line)["answer"] for name in ("train.jsonl", "test.jsonl")
               for line in (GSM8K / name).read_text(encoding="utf-8").splitlines()]
    assert len(answers) == 8792
    assert [a for a in answers if is_repetitive(a)] == []
    assert all(len(final_answers(a)) == 1 for a in answers)
    # One reference solution gives its working without a number before the answer line.
    assert sum(has_no_reasoning(a) for a in answers) <= 1


@pytest.mark.parametrize(("response", "expected"), [
    ("#### 10", True),
    ("The answer is #### 10", True),  # words, but no number worked with
    (r"\boxed{10}", True),
    ("10", True),
    ("57 + 26 = 83\n#### 83", False),
    ("She had 5 and got 5 more, so 10.", False),
    ("I do not know.", False),  # no answer at all: not counted as unreasoned
])
def test_no_reasoning_before_the_answer(response: str, expected: bool) -> None:
    assert has_no_reasoning(response) is expected


def test_well_formed_needs_one_answer_no_loop_and_an_end() -> None:
    ended, cut = response_facts(20, 96, False), response_facts(96, 96, True)
    assert form("57 + 26 = 83\n#### 83", ended).well_formed
    assert form("57 + 26 = 83\n#### 83", ended).answer == "83"
    assert not form("57 + 26 = 83\n#### 83", cut).well_formed
    assert not form("#### 83 or #### 84", ended).well_formed
    assert form("#### 83 or #### 84", ended).answer is None
    assert not form("#### 10\n" * 5, ended).well_formed
    assert final_answers("#### 1,072. and #### -3") == ["1072", "-3"]
    # Unsaid truncation: taken as ended (the text alone cannot tell).
    assert form("#### 83").well_formed
