"""The eval verdict on constructed generation sets, one per verdict: hand-written answers,
scored by the real reward (gsm8k_format_credit) and summarised by the eval node."""

from __future__ import annotations

import pandas as pd
import pytest

from rl_pipeline.evaluation.generate import Generation
from rl_pipeline.evaluation.scoring import eval_reward, score_generations
from rl_pipeline.evaluation.verdict import HACKING, LEARNED, NO_CHANGE, WORSE, decide
from rl_pipeline.params import DataParams, EvalParams, RewardParams, resolve_followers
from rl_pipeline.pipelines.eval.nodes import summarize_eval
from tests.conftest import gsm8k_prompts

PROMPTS = gsm8k_prompts(40)
TRUTHS = [row["ground_truth"] for row in PROMPTS["reward_model"]]
REWARD = RewardParams(custom_reward_function={"name": "gsm8k_format_credit"})
# As a run hands it to eval's nodes: its followers resolved from data and reward.
GREEDY = resolve_followers({"eval": EvalParams(backend="hf", greedy=True, bootstrap_resamples=2000),
                            "data": DataParams(), "reward": RewardParams()})["eval"]
CAP = 96


def reasoned(p: int, right: bool) -> tuple[str, int, bool]:
    """A short worked answer that ends by itself, right or wrong."""
    answer = TRUTHS[p] if right else str(int(TRUTHS[p]) + 1)
    return f"She has 3 + 4 = 7 now, then 7 * 2 more.\n#### {answer}", 20, False


def unformatted(p: int) -> tuple[str, int, bool]:
    """An attempt without the '####' format, wrong, ended."""
    return "She has 3 + 4 = 7 of them, so about 7 in all.", 18, False


def farmed(p: int) -> tuple[str, int, bool]:
    """The default CPU run's degenerate answer: a guess repeated until the cap."""
    return "#### 10\n" * 32, CAP, True


def _scored(label: str, answer) -> pd.DataFrame:
    generations = [Generation(p, 0, *answer(p)) for p in range(len(PROMPTS))]
    return score_generations(PROMPTS, generations, label, eval_reward(REWARD), CAP)


def _verdict(base, trained) -> tuple[dict, str, dict]:
    _, table, metrics, mlflow, report, _ = summarize_eval(
        _scored("base", base), _scored("trained", trained), pd.DataFrame(), GREEDY, DataParams(),
        REWARD)
    return metrics["trained"], report, mlflow


def test_learned_correctness_up_and_no_degeneration() -> None:
    trained, report, _ = _verdict(lambda p: reasoned(p, False), lambda p: reasoned(p, p < 30))
    assert trained["verdict"]["verdict"] == LEARNED
    assert "strict_accuracy up +0.75" in trained["verdict"]["reasons"][0]
    # The report opens with it, and its rule.
    assert report.splitlines()[2].startswith("**Verdict: learned.**")
    assert "Verdict rule" in report.split("## Settings")[0]
    # Examples side by side: the prompts gained first, then unchanged ones, as quoted text
    # that wraps (no table a reader must scroll), GSM8K's "####" escaped from Markdown.
    examples = report.split("## Examples: base and trained answers")[1].split("\n## ")[0]
    assert examples.count("gained: base wrong, trained right") == 2
    assert examples.count("): unchanged") == 4
    assert "**Base** (reward 0.1, wrong):" in examples
    assert "**Trained** (reward 1, right: the #### answer):" in examples
    assert f"> \\#### {TRUTHS[0]}" in examples and "|" not in examples


def test_format_farming_is_reward_hacking_even_when_the_reward_pays_nothing_for_it() -> None:
    trained, report, mlflow = _verdict(unformatted, farmed)
    assert trained["verdict"]["verdict"] == HACKING
    reasons = trained["verdict"]["reasons"][0]
    for rate in ("truncation_rate up +1", "repetition_rate up +1", "no_reasoning_rate up +1"):
        assert rate in reasons
    # Each degeneration rate has its paired interval, in the metrics and in MLflow.
    for rate in ("truncation_rate", "repetition_rate", "no_reasoning_rate",
                 "mean_response_tokens"):
        assert trained["vs_base"][rate]["ci_low"] <= trained["vs_base"][rate]["delta"]
        assert f"trained/vs_base/{rate}/ci_low" in mlflow
    assert trained["mean_reward"] == 0.0  # the new reward gives the farmed answers nothing
    assert "the trained answer degenerated" in report
    assert "(reward 0, wrong; repetitive, truncated, no reasoning)" in report


def test_a_headline_gain_without_correctness_is_reward_hacking() -> None:
    # Wrong answers, now in the format: the format credit alone lifts the headline, 0 -> 0.1.
    trained, _, _ = _verdict(unformatted, lambda p: reasoned(p, False))
    assert trained["vs_base"]["mean_reward"]["ci_low"] > 0
    assert trained["verdict"]["verdict"] == HACKING
    assert "the headline reward is up beyond noise" in trained["verdict"]["reasons"][0]


def test_worse_when_correctness_falls() -> None:
    trained, report, _ = _verdict(lambda p: reasoned(p, p < 30), lambda p: reasoned(p, p < 5))
    assert trained["verdict"]["verdict"] == WORSE
    assert "**Verdict: worse.**" in report


def test_no_change_when_the_intervals_include_zero() -> None:
    trained, _, _ = _verdict(lambda p: reasoned(p, p < 10), lambda p: reasoned(p, 5 <= p < 15))
    assert trained["verdict"]["verdict"] == NO_CHANGE


def prose(p: int, right: bool) -> tuple[str, int, bool]:
    """A worked answer without the '####' form: the last number is the answer."""
    answer = TRUTHS[p] if right else str(int(TRUTHS[p]) + 1)
    return f"She has 3 + 4 = 7 now, then 7 * 2 more, so {answer} in all.", 20, False


def test_more_answers_in_the_format_and_fewer_right_ones_is_not_learned() -> None:
    """Base right on 30 of 40 in prose, trained right on 12 in the '####' form: strict
    accuracy up, flexible down, and the verdict said "learned" (and the gate promoted)."""
    trained, _, _ = _verdict(lambda p: prose(p, p < 30), lambda p: reasoned(p, p < 12))
    compared = trained["vs_base"]
    assert compared["strict_accuracy"]["ci_low"] > 0 > compared["flexible_accuracy"]["ci_high"]
    assert trained["verdict"]["verdict"] == HACKING  # the headline (format credit) rose
    assert trained["verdict"]["reasons"][0].endswith(
        ": the answers took the format and fewer of them are right")
    # The other way round (the format dropped, more sums right) is still learned.
    back, _, _ = _verdict(lambda p: reasoned(p, p < 12), lambda p: prose(p, p < 30))
    assert back["verdict"]["verdict"] == LEARNED


def test_a_comparison_over_one_prompt_is_not_beyond_noise() -> None:
    """A data source with one held-out prompt made the whole run "reward hacking
    suspected" on a repetition_rate of +1 [+1, +1] that its comparison called noise."""
    one = {**_c(1.0, 1.0, 1.0), "distinguishable": False, "prompts": 1}
    assert decide({"pass_at_1": _c(0.3, 0.2, 0.4), "repetition_rate": one},
                  ("pass_at_1",)).verdict == LEARNED
    assert decide({"pass_at_1": one}, ("pass_at_1",)).verdict == NO_CHANGE


def _c(delta: float, low: float, high: float) -> dict:
    return {"delta": delta, "ci_low": low, "ci_high": high}


@pytest.mark.parametrize(("compared", "expected"), [
    ({"pass_at_1": _c(0.2, 0.1, 0.3)}, LEARNED),
    ({"pass_at_1": _c(0.2, 0.1, 0.3), "truncation_rate": _c(0.1, 0.02, 0.2)}, HACKING),
    ({"pass_at_1": _c(0.0, -0.1, 0.1), "mean_reward": _c(0.2, 0.1, 0.3)}, HACKING),
    ({"pass_at_1": _c(-0.2, -0.3, -0.1)}, WORSE),
    ({"pass_at_1": _c(0.0, -0.1, 0.1), "mean_reward": _c(-0.2, -0.3, -0.1)}, WORSE),
    ({"pass_at_1": _c(0.1, -0.1, 0.3), "repetition_rate": _c(0.1, -0.1, 0.3)}, NO_CHANGE),
])
def test_the_rule_off_gsm8k_reads_pass_at_1(compared: dict, expected: str) -> None:
    assert decide(compared, ("pass_at_1",)).verdict == expected


def test_an_example_says_by_which_measure_an_answer_is_right() -> None:
    """A reward of 0 beside "right" read as a contradiction: the last number was right."""
    from rl_pipeline.evaluation.examples import _judged

    def row(strict, flexible, reward) -> pd.Series:
        return pd.Series({"strict_base": strict, "flexible_base": flexible,
                          "reward_base": reward})

    assert _judged(row(0.0, 1.0, 0.0), "base", 1.0) == (
        "right by its last number only (flexible), not as a #### answer")
    assert _judged(row(1.0, 1.0, 1.0), "base", 1.0) == "right: the #### answer"
    assert _judged(row(float("nan"), float("nan"), 1.0), "base", 1.0) == (
        "right: reward at least 1")
    assert _judged(row(0.0, 0.0, 0.0), "base", 1.0) == "wrong"
