"""Reward functions: verl's GSM8K scoring, math-verify, custom functions, error containment."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from verl.utils.reward_score import gsm8k as verl_gsm8k

from rl_pipeline.engines.verl.config import reward_overrides
from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import (
    OverlongPenalty,
    SafeReward,
    build_reward,
    compute_score,
    flexible_gsm8k,
    gsm8k_format_credit,
    load_reward_function,
    math_verify_score,
    strict_gsm8k,
)
from rl_pipeline.rewards.form import response_facts
from rl_pipeline.rewards.scoring import FORMAT_CREDIT, verl_reward

# Responses of the kinds models give, with the ground truth 72.
RESPONSES = [
    "48/2 = 24 in May, 48 + 24 = 72 altogether.\n#### 72",
    "So she sold 72 clips.\n#### 72.0",
    "#### 1,072",
    "She sold 70 clips. #### 70",
    "The answer is 72",
    "Natalia sold 72 clips in total. The answer is 72.",
    "#### $72",
    "I think #### 72 but wait, it is #### 71",
    "",
    "no numbers at all",
    "x" * 500 + " 72",
]


# Scored by hand against the ground truth 72, by the rule GSM8K training uses (verl's strict
# GSM8K score): the last "#### <number>" within the last 300 characters, commas dropped,
# compared as text.
STRICT_BY_HAND = [
    ("48/2 = 24 in May, 48 + 24 = 72 altogether.\n#### 72", 1.0),
    ("So she sold 72 clips.\n#### 72.0", 0.0),  # text, not value: "72.0" is not "72"
    ("#### 7,2", 1.0),  # commas are dropped wherever they are
    ("#### 1,072", 0.0),
    ("She sold 70 clips. #### 70", 0.0),
    ("The answer is 72", 0.0),  # no "#### "
    ("####72", 0.0),  # the space is part of the format
    ("#### $72", 0.0),  # "$" is not in the number pattern
    ("I think #### 72 but wait, it is #### 71", 0.0),  # the last answer counts
    ("I think #### 71 but wait, it is #### 72", 1.0),
    ("x" * 500 + "\n#### 72", 1.0),
    ("#### 72\n" + "x" * 300, 0.0),  # outside the last 300 characters
    ("", 0.0),
]


@pytest.mark.parametrize(("response", "score"), STRICT_BY_HAND)
def test_strict_gsm8k_scores_as_scored_by_hand(response: str, score: float) -> None:
    assert strict_gsm8k("openai/gsm8k", response, "72") == score
    # compute_score, the default reward, scores GSM8K sources the same way
    assert compute_score("openai/gsm8k", response, "72") == score


def test_flexible_agrees_with_verl_where_verls_match_is_a_clean_number() -> None:
    clean = [r for r in RESPONSES
             if (a := verl_gsm8k.extract_solution(r, method="flexible")) is not None
             and a.replace(",", "").lstrip("-").isdigit()]
    assert len(clean) >= 6
    for response in clean:
        assert flexible_gsm8k("openai/gsm8k", response, "72") == verl_gsm8k.compute_score(
            response, "72", method="flexible"), response


def test_flexible_compares_numbers_by_value() -> None:
    # verl's flexible mode compares the raw match, so "72." scores 0 there; ours scores 1.
    response = "Natalia sold 72 clips in total. The answer is 72."
    assert verl_gsm8k.compute_score(response, "72", method="flexible") == 0
    assert flexible_gsm8k("openai/gsm8k", response, "72") == 1.0
    assert flexible_gsm8k("openai/gsm8k", "It costs $1,072 in all", "1072") == 1.0
    assert flexible_gsm8k("openai/gsm8k", "It costs 1072 or 1073", "1072") == 0.0


# The exact degenerate answers of the default CPU run before the reward refused them: a
# guessed number in the format, repeated until the 96-token cap (62 of 64 trained answers).
FARMED = "#### 10\n" * 32
ENDED = response_facts(20, 96, truncated=False)
CUT = response_facts(96, 96, truncated=True)


def test_format_credit_refuses_a_guess_repeated_to_the_length_cap() -> None:
    for facts in (CUT, ENDED, None):  # truncated, ended, or not said: no credit either way
        assert gsm8k_format_credit("openai/gsm8k", FARMED, "18", facts) == 0.0
    # Not even when the repeated guess is right: it is not one final answer.
    assert gsm8k_format_credit("openai/gsm8k", FARMED, "10", CUT) == 0.0
    # The same loop within a line.
    assert gsm8k_format_credit("openai/gsm8k", "The answer is #### 10. " * 12, "18", ENDED) == 0.0


@pytest.mark.parametrize(("response", "facts", "expected"), [
    # One correct answer: 1.0, ended or not (truncation costs only the format credit).
    ("48/2 = 24 in May, 48 + 24 = 72 altogether.\n#### 72", ENDED, 1.0),
    ("48/2 = 24 in May, 48 + 24 = 72 altogether.\n#### 72", CUT, 1.0),
    ("#### 1,072", ENDED, FORMAT_CREDIT),  # 1072, not 72: wrong, but well-formed
    ("So she sold 72 clips.\n#### 72.0", ENDED, 1.0),
    # A wrong answer in a well-formed response: the credit.
    ("She sold 70 clips. #### 70", ENDED, FORMAT_CREDIT),
    # ... but not when the cap cut it off: it did not end by itself.
    ("She sold 70 clips. #### 70", CUT, 0.0),
    # Two answers (hedging) or none: nothing.
    ("I think #### 72 but wait, it is #### 71", ENDED, 0.0),
    ("The answer is 72", ENDED, 0.0),
    ("", ENDED, 0.0),
    # A reasoned answer whose lines repeat: nothing, right or wrong.
    ("24 + 48 = 72\n24 + 48 = 72\n24 + 48 = 72\n#### 72", ENDED, 0.0),
])
def test_format_credit_pays_only_for_a_single_final_answer_that_ended_by_itself(
        response: str, facts: dict, expected: float) -> None:
    assert gsm8k_format_credit("openai/gsm8k", response, "72", facts) == expected


def test_format_credit_applies_to_gsm8k_style_sources_only() -> None:
    assert gsm8k_format_credit("rl_pipeline/arithmetic", "57 + 26 = 83\n#### 83", "83",
                               ENDED) == 1.0
    # Other sources score exactly as compute_score.
    assert gsm8k_format_credit("math", r"\boxed{3}", "4") == 0.0
    assert gsm8k_format_credit("math", r"\boxed{4}", "4") == 1.0
    assert load_reward_function(None, "gsm8k_format_credit") is gsm8k_format_credit


@pytest.mark.parametrize(("length", "expected"), [
    (10, 0.0), (64, 0.0),  # before the buffer (the last 32 of 96 tokens)
    (72, -0.25), (80, -0.5), (96, -1.0)])  # linear, -factor at the cap
def test_overlong_penalty_falls_linearly_over_the_buffer(length: int, expected: float) -> None:
    penalty = OverlongPenalty(buffer_len=32, factor=1.0)
    assert penalty(response_facts(length, 96, truncated=length == 96)) == pytest.approx(expected)
    assert OverlongPenalty(buffer_len=32, factor=0.5)(response_facts(length, 96, False)) == \
        pytest.approx(expected / 2)
    assert OverlongPenalty(0)(response_facts(length, 96, False)) == 0.0  # off
    assert penalty({}) == 0.0  # no length given: no penalty


def test_the_reward_group_builds_one_reward_for_trainers_and_eval() -> None:
    reward = RewardParams.model_validate({
        "custom_reward_function": {"name": "gsm8k_format_credit"},
        "overlong_buffer_len": 16, "overlong_penalty_factor": 1.0})
    built = build_reward(reward)
    right = "24 + 48 = 72\n#### 72"
    assert built("openai/gsm8k", right, "72", response_facts(10, 64, False)) == 1.0
    # 56 of 64 tokens: half-way into the 16-token buffer.
    assert built("openai/gsm8k", right, "72", response_facts(56, 64, False)) == 0.5
    # verl's entry point, with the group as verl passes it (reward_kwargs: the group as
    # JSON, from the same model): the score, and the parts verl keeps per sample
    # (reward_extra_info).
    overrides = reward_overrides(reward, None)
    (group,) = [o.split("=", 1)[1].strip("'") for o in overrides
                if o.startswith("+reward.custom_reward_function.reward_kwargs.")]
    assert RewardParams.model_validate_json(group) == reward
    assert asyncio.run(verl_reward("openai/gsm8k", right, "72", response_facts(56, 64, False),
                                   reward=group)) == {
        "score": 0.5, "reward_function": 1.0, "overlong_penalty": -0.5,
        "reward_error": 0.0, "reward_timeout": 0.0}


def test_math_verify_on_boxed_answers() -> None:
    assert math_verify_score("math", r"so \boxed{\frac{1}{2}}", "0.5") == 1.0
    assert math_verify_score("math", r"so \boxed{3}", "4") == 0.0
    assert compute_score("HuggingFaceH4/MATH-500", r"\boxed{2\sqrt{2}}", r"\sqrt{8}") == 1.0


def test_custom_reward_function_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def length_bonus(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': min(len(solution_str), 10) / 10, 'len': len(solution_str)}\n"
        "def helper(x):\n    return x\n")
    fn = load_reward_function(str(path), "length_bonus")
    assert fn("s", "abcde", "x")["score"] == 0.5
    assert SafeReward(fn)("s", "abcde", "x") == 0.5  # a dict's "score" is the reward


def test_a_reward_file_shipped_as_a_module_loads_by_name(tmp_path: Path, monkeypatch) -> None:
    """On a Ray cluster's nodes the file is a module of its own (Ray's py_modules)."""
    (tmp_path / "shipped_reward.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str == ground_truth)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_function("pkg://shipped_reward", "score")
    assert (fn("s", "42", "42"), fn("s", "41", "42")) == (1.0, 0.0)
    with pytest.raises(ValueError, match="'pkg://not_shipped' failed to import"):
        load_reward_function("pkg://not_shipped", "score")


def test_custom_reward_function_errors_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_reward_function(str(tmp_path / "nope.py"), "f")
    path = tmp_path / "r.py"
    path.write_text("def one(a):\n    return 1\ndef two(a, b, c, d=None):\n    return 1\n")
    with pytest.raises(ValueError, match="'missing' is not a function.*functions found: one, two"):
        load_reward_function(str(path), "missing")
    with pytest.raises(ValueError, match="must accept \\(data_source, solution_str"):
        load_reward_function(str(path), "one")
    with pytest.raises(ValueError, match="not a built-in reward"):
        load_reward_function(None, "mystery")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(ValueError, match="failed to import"):
        load_reward_function(str(broken), "f")


def test_a_raising_reward_scores_zero_and_is_counted_unless_strict() -> None:
    def picky(data_source, solution_str, ground_truth, extra_info=None):
        if "boom" in solution_str:
            raise ZeroDivisionError("boom")
        return 1.0

    safe = SafeReward(picky)
    assert [safe("s", t, "1") for t in ("ok", "boom", "ok", "boom")] == [1.0, 0.0, 1.0, 0.0]
    assert safe.errors == 2
    with pytest.raises(ZeroDivisionError):
        SafeReward(picky, strict=True)("s", "boom", "1")
