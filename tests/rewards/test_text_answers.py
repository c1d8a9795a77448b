"""The text scorers (exact match, a choice among options): what they read as the final
answer, how they normalise, and that the self-test checks data scored by them."""

from __future__ import annotations

import re

import pytest

from rl_pipeline.params import ConfigError, RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.self_test import ideal_response, run_self_test, self_test, wrong_answer
from rl_pipeline.rewards.text_answers import (
    choice,
    chosen_option,
    exact_match,
    final_answer,
    normalize_answer,
)


@pytest.mark.parametrize(("response", "answer"), [
    ("We reason.\n#### Paris", "Paris"),
    ("Reasoning first.\nFinal answer: The Eiffel Tower.\nThanks!", "The Eiffel Tower"),
    ("The answer is (c).", "(c)"),
    (r"so \boxed{blue} it is", "blue"),
    ("line one\n\nthe last line.\n", "the last line"),
    ("", ""),
])
def test_the_final_answer_is_after_the_last_marker_else_boxed_else_the_last_line(
        response: str, answer: str) -> None:
    assert final_answer(response) == answer


def test_normalisation_drops_case_punctuation_and_extra_spaces_only() -> None:
    assert normalize_answer("  The  Eiffel-Tower! ") == "the eiffeltower"
    assert normalize_answer("ＡＢＣ") == "abc"  # full-width letters, NFKC
    assert normalize_answer("a cat") != normalize_answer("cat")  # articles are words


@pytest.mark.parametrize(("response", "truth", "score"), [
    ("Answer: paris", "Paris", 1.0),
    ("Answer: Paris, France", "Paris", 0.0),
    ("#### new york", ["NYC", "New York"], 1.0),  # several acceptable answers
    ("I am not sure.", "Paris", 0.0),
    ("Answer:", "", 0.0),  # an empty answer never matches, not even an empty truth
    # A number keeps its sign, point and slash: each of these scored 1.0.
    ("Answer: 5", "-5", 0.0), ("Answer: -5", "5", 0.0), ("Answer: 35", "3.5", 0.0),
    ("Answer: 12", "1/2", 0.0), ("Answer: 12", "1:2", 0.0),
    ("Answer: -5", "-5", 1.0), ("Answer: 3.5.", "3.5", 1.0), ("Answer: 1,000", "1000", 1.0),
    # A point that starts a number is kept: .5 and -.5 scored 1.0 against 5.
    ("Answer: .5", "5", 0.0), ("Answer: 5", ".5", 0.0), ("Answer: -.5", "5", 0.0),
    ("Answer: .5", ".5", 1.0), ("Answer: -.5", "-.5", 1.0), ("Answer: v.2", "v2", 1.0),
])
def test_exact_match(response: str, truth, score: float) -> None:
    assert exact_match("exact_match", response, truth) == score


@pytest.mark.parametrize(("response", "picked"), [
    ("Answer: B", "B"), ("The answer is (c).", "C"), ("Answer: B. Paris", "B"),
    ("A is wrong.\nSo D", "D"), ("Answer: none of them", None),
    # After a marker the first letter: these picked the I and the A.
    ("Answer: B, as I said", "B"), ("Answer: B (option A is wrong)", "B"),
    ("I think it is B", "B"),  # no marker: the last
    # A lone lower-case letter after a marker (each was None, or the I); not an article.
    ("Answer: b", "B"), ("Answer: b) Paris", "B"), ("Answer: (c)", "C"),
    ("Answer: b, as I said", "B"), ("Answer: a dog", None),
    # An abbreviation is not an option letter (a point must end the letter's word)
    ("Answer: i.e. B", "B"), ("The answer is e.g. (C)", "C"),
])
def test_the_option_picked_is_the_first_letter_after_a_marker_else_the_last(
        response: str, picked: str | None) -> None:
    assert chosen_option(response) == picked


def test_a_ground_truth_that_is_a_number_or_missing_is_read_not_raised_on() -> None:
    assert exact_match("exact_match", "Answer: 72", 72) == 1.0
    assert exact_match("exact_match", "Answer: 72", None) == 0.0
    assert choice("choice", "Answer: 72", 72) == 1.0


def test_choice_compares_letters_case_blind_and_labels_as_exact_match() -> None:
    assert choice("choice", "Answer: (b)", "B") == 1.0
    assert choice("choice", "Answer: C", "b") == 0.0
    assert choice("choice", "Sentiment: clear.\nAnswer: Positive!", "positive") == 1.0
    assert choice("choice", "Answer: negative", "positive") == 0.0
    # A one-letter label outside A-Z is a label: 'Б' never matched a letter pattern
    assert choice("choice", "Answer: Б", "Б") == 1.0
    assert choice("choice", "Answer: Б", "В") == 0.0


@pytest.mark.parametrize(("source", "truth"), [("exact_match", "Paris"), ("choice", "B"),
                                               ("choice", "positive")])
def test_the_self_test_passes_data_these_scorers_read(source: str, truth: str) -> None:
    reward = build_reward(RewardParams())
    rows = [{"data_source": source, "reward_model": {"ground_truth": truth},
             "extra_info": {"split": "train", "index": i}} for i in range(4)]
    report = self_test(lambda row, response, facts: reward(
        row["data_source"], response, row["reward_model"]["ground_truth"], facts),
        rows, 1.0, "compute_score")[source]
    assert report["passed"], report
    assert "chosen by data_source" in report["scorer"] and source in report["scorer"]
    assert reward(source, ideal_response(wrong_answer(truth)), truth) == 0.0


def test_a_wrong_option_letter_is_the_next_letter() -> None:
    assert (wrong_answer("B"), wrong_answer("z"), wrong_answer("7")) == ("C", "A", "8")


def test_the_self_test_catches_letters_under_the_gsm8k_source() -> None:
    """Choice data prepared under the default data_source scores 0 on GSM8K's scorer."""
    reward = build_reward(RewardParams())
    rows = [{"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "B"}}]
    report = self_test(lambda row, response, facts: reward(
        row["data_source"], response, row["reward_model"]["ground_truth"], facts),
        rows, 1.0, "compute_score")["openai/gsm8k"]
    assert not report["passed"] and report["gold_correct"] == 0.0


# --- the regex reward: the user's pattern reads the answer

def _regex(pattern: str, example: str = "{answer}", **reward):
    return build_reward(RewardParams.model_validate({
        "custom_reward_function": {"name": "regex"},
        "regex": {"pattern": pattern, "example": example}, **reward}))


def test_the_regex_reward_reads_the_last_match_and_normalises() -> None:
    reward = _regex(r"Label:\s*(?P<answer>[\w-]+)", "Label: {answer}")
    assert reward("tickets", "Label: billing\nno wait.\nLabel: Refund", "refund") == 1.0
    assert reward("tickets", "Label: Refund\nLabel: billing", "refund") == 0.0
    assert reward("tickets", "It is a refund.", "refund") == 0.0  # no match: no answer
    scored = reward.score("tickets", "Label: Refund", "refund")
    assert scored.pred == "Refund"  # what majority voting counts


def test_a_pattern_that_backtracks_forever_is_cut_at_the_time_limit() -> None:
    reward = _regex(r"^(?:(a|aa)+$|Label: (?P<answer>\w+))", "Label: {answer}", timeout_s=0.5)
    scored = reward.score("s", "a" * 40 + "!", "a")
    assert scored.reward == 0.0 and "TimeoutError" in scored.error


@pytest.mark.parametrize(("regex", "message"), [
    ({"pattern": "Label: (", "example": "Label: {answer}"}, "not a regular expression"),
    ({"pattern": r"Label: \w+", "example": "Label: {answer}"}, "no group"),
    ({"pattern": r"Answer: (\w+)", "example": "Label: {answer}"}, "does not read the answer"),
    ({"pattern": r"Label: (\w+)", "example": "Label:"}, "put {answer}"),
])
def test_a_pattern_that_cannot_read_its_example_is_refused(regex, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        RewardParams.model_validate({"custom_reward_function": {"name": "regex"},
                                     "regex": regex})


def test_the_self_test_writes_ideal_responses_as_the_pattern_reads_them() -> None:
    rows = [{"data_source": "tickets", "reward_model": {"ground_truth": label},
             "extra_info": {"index": i}} for i, label in enumerate(["refund", "billing", "B"])]
    params = RewardParams.model_validate({
        "custom_reward_function": {"name": "regex"},
        "regex": {"pattern": r"Label:\s*(?P<answer>\w+)", "example": "Label: {answer}"}})
    score = build_reward(params, strict=True)
    report, failed = run_self_test(lambda row, response, facts: score.score(
        row["data_source"], response, row["reward_model"]["ground_truth"], facts), rows, params)
    assert failed == [] and report["tickets"]["gold_correct"] == 1.0
    assert report["tickets"]["examples"][0]["response"].endswith("Label: refund")
    # A pattern that reads its example but not the data's answers fails, naming it.
    params = params.model_copy(update={"regex": params.regex.model_copy(
        update={"pattern": r"Label: (?P<answer>[A-Za-z])"})})  # one letter: "r" of "refund"
    score = build_reward(params, strict=True)
    _, failed = run_self_test(lambda row, response, facts: score.score(
        row["data_source"], response, row["reward_model"]["ground_truth"], facts), rows, params)
    assert failed and "regex: the answer reward.regex.pattern reads" in failed[0][1]
