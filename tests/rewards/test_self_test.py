"""The reward self-test: ground truths written as ideal and as wrong responses, per data
source, with the built-in rewards and with broken ones."""

from __future__ import annotations

import logging

import pytest

from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.self_test import (
    ideal_response,
    run_self_test,
    scorer_for,
    self_test,
    wrong_answer,
)

# MATH-style ground truths, as data_prep takes them from a MATH dataset's answers.
MATH_TRUTHS = [r"\frac{1}{2}", r"2\sqrt{2}", r"\pi", "(3, -1)", r"\frac{7}{9}", "x^2+1"]


def _rows(source: str, truths: list[str]) -> list[dict]:
    return [{"data_source": source, "reward_model": {"ground_truth": t},
             "extra_info": {"split": "train", "index": i}} for i, t in enumerate(truths)]


def _run(reward: RewardParams, rows: list[dict]):
    score = build_reward(reward, strict=True)  # as data_prep and the preflights call it
    return run_self_test(
        lambda row, response, facts: score(row["data_source"], response,
                                           row["reward_model"]["ground_truth"], facts),
        rows, reward)


def test_math_answers_under_a_gsm8k_data_source_are_refused_naming_source_and_parameter(
) -> None:
    report, failed = _run(RewardParams(), _rows("openai/gsm8k", MATH_TRUTHS))
    assert [source for source, _ in failed] == ["openai/gsm8k"]
    message = failed[0][1]
    assert "data_source 'openai/gsm8k'" in message
    assert "strict_gsm8k" in message or "GSM8K strict" in message  # the scorer picked
    assert "data_prep.data_source" in message  # the parameter to change
    assert message.count("ground truth") == 3  # three example rows
    assert r"'\\frac{1}{2}'" in message
    assert report["openai/gsm8k"]["gold_correct"] == 0.0


def test_math_answers_under_a_math_data_source_pass() -> None:
    report, failed = _run(RewardParams(), _rows("HuggingFaceH4/MATH-500", MATH_TRUTHS))
    assert failed == []
    result = report["HuggingFaceH4/MATH-500"]
    assert result["passed"] and result["gold_correct"] == 1.0
    assert result["wrong_below_gold"] == 1.0
    assert "math-verify" in result["scorer"]


@pytest.mark.parametrize("name", ["compute_score", "gsm8k_format_credit", "flexible_gsm8k"])
def test_gsm8k_style_golds_pass_with_each_builtin(name: str) -> None:
    reward = RewardParams.model_validate({"custom_reward_function": {"name": name}})
    for source in ("openai/gsm8k", "rl_pipeline/arithmetic"):
        report, failed = _run(reward, _rows(source, ["18", "1072", "3.5", "-4"]))
        assert failed == [] and report[source]["passed"], report


def test_a_reward_that_pays_everything_is_refused(tmp_path) -> None:
    generous = tmp_path / "generous.py"
    generous.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                        "    return 1.0\n")
    reward = RewardParams.model_validate(
        {"custom_reward_function": {"path": str(generous), "name": "score"}})
    report, failed = _run(reward, _rows("openai/gsm8k", ["18", "7"]))
    assert report["openai/gsm8k"]["gold_correct"] == 1.0
    assert report["openai/gsm8k"]["wrong_below_gold"] == 0.0
    assert "wrong answers scored less on 0%" in failed[0][1]
    assert f"score from {generous}" in failed[0][1]


def test_a_source_unknown_to_the_reward_names_what_it_raised() -> None:
    _, failed = _run(RewardParams(), _rows("openai/gsm8K", ["18"]))
    assert "NotImplementedError" in failed[0][1]
    assert "verl's default_compute_score for 'openai/gsm8K'" in failed[0][1]
    # The data_source is what to change, not the reward function (it said the opposite).
    assert failed[0][1].endswith(
        "To fix: the reward has no scorer for data_source 'openai/gsm8K' (NotImplementedError "
        "on every row): set data_prep.data_source to a value whose scorer reads these answers "
        "(table: docs/rewards.md), or reward.custom_reward_function to a reward for this data; "
        "reward.self_test=warn only warns.")
    assert "cannot help" not in failed[0][1]


def test_warn_logs_and_off_skips(caplog) -> None:
    rows = _rows("openai/gsm8k", MATH_TRUTHS)
    with caplog.at_level(logging.WARNING):
        report, failed = _run(RewardParams(self_test="warn"), rows)
    assert failed == [] and not report["openai/gsm8k"]["passed"]
    assert "reward self-test failed for data_source 'openai/gsm8k'" in caplog.text
    report, failed = _run(RewardParams(self_test="off"), rows)
    assert failed == [] and "skipped" in report


def test_ideal_and_wrong_responses() -> None:
    assert ideal_response("18").endswith("#### 18") and r"\boxed{18}" in ideal_response("18")
    assert (wrong_answer("18"), wrong_answer("1,072"), wrong_answer("2.5")) == \
        ("19", "1073", "3.5")
    assert wrong_answer(r"\frac{1}{2}") == r"\frac{1}{2}+1"
    assert "chosen by data_source 'openai/gsm8k'" in scorer_for("openai/gsm8k",
                                                                "compute_score")


def test_the_self_test_checks_a_weighted_reward_and_reports_each_term() -> None:

    reward = build_reward(RewardParams.model_validate({"terms": [
        {"name": "compute_score", "label": "correct"},
        {"name": "well_formed", "weight": 0.1, "label": "format"}]}))
    rows = [{"data_source": "openai/gsm8k", "reward_model": {"ground_truth": str(n)}}
            for n in (3, 18, 72)]
    report = self_test(lambda row, response, facts: reward.score(
        row["data_source"], response, row["reward_model"]["ground_truth"], facts),
        rows, 1.0, "compute_score")["openai/gsm8k"]
    assert report["passed"] and report["gold_correct"] == 1.0
    assert report["terms"] == {"correct": {"gold": 1.0, "wrong": 0.0},
                               "format": {"gold": 1.0, "wrong": 1.0}}
