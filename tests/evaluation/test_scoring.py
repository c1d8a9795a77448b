"""The headline per data source on a mixed eval set: GSM8K, MATH (\\boxed{} answers) and a
source that only a custom reward file knows; strict and flexible on GSM8K rows only."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from rl_pipeline.evaluation.generate import Generation
from rl_pipeline.evaluation.metrics import compare_models, model_metrics, per_prompt_scores
from rl_pipeline.evaluation.scoring import eval_reward, score_generations
from rl_pipeline.params import RewardParams

# The training reward of a mixed run: capitals by its own rule (and it reports the answer it
# read, verl's "pred"), everything else by the built-in compute_score.
CUSTOM_REWARD = '''
from rl_pipeline.rewards import compute_score

def score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "acme/capitals":
        words = solution_str.replace(".", " ").split()
        answer = words[-1] if words else ""
        return {"score": float(answer.lower() == ground_truth.lower()), "pred": answer.lower()}
    return compute_score(data_source, solution_str, ground_truth, extra_info)
'''

PROMPTS = pd.DataFrame({
    "data_source": ["openai/gsm8k", "openai/gsm8k", "lighteval/MATH", "lighteval/MATH",
                    "acme/capitals", "acme/capitals"],
    "prompt": [[{"role": "user", "content": q}] for q in (
        "Sam has 70 apples and gets 2 more. How many?", "What is 12 - 2?", "Half of 1?",
        "What is 1 + 2?", "Capital of France?", "Capital of Italy?")],
    "reward_model": [{"ground_truth": t} for t in ("72", "10", "\\frac{1}{2}", "3", "Paris",
                                                   "Rome")],
})
# Two samples per prompt, one list per prompt.
BASE = [["So 72.", "#### 72"],                            # strict 1/2, flexible 2/2
        ["#### 11", "It is 10."],                         # strict 0, flexible 1/2
        ["\\boxed{0.5}", "maybe \\boxed{2}"],            # math-verify: 0.5 == 1/2
        ["\\boxed{4}", "\\boxed{4}"],
        ["It is Paris.", "Lyon"],
        ["Milan", "Milan"]]
TRAINED = [["#### 72", "#### 72"],
           ["#### 10", "#### 10"],
           ["\\boxed{\\frac{1}{2}}", "\\boxed{\\frac12}"],
           ["\\boxed{3}", "\\boxed{4}"],
           ["Paris.", "paris"],
           ["Rome", "Milan"]]


def _score(texts: list[list[str]], label: str, reward_file: Path) -> pd.DataFrame:
    generations = [Generation(p, s, text, tokens=5, truncated=False)
                   for p, samples in enumerate(texts) for s, text in enumerate(samples)]
    reward = RewardParams(custom_reward_function={"path": str(reward_file), "name": "score"})
    return score_generations(PROMPTS, generations, label, eval_reward(reward), max_new_tokens=64)


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "mixed_reward.py"
    path.write_text(CUSTOM_REWARD)
    return path


def test_the_configured_reward_is_the_headline_of_every_source(reward_file) -> None:
    base = _score(BASE, "base", reward_file)
    assert list(base["reward"]) == [0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    m = model_metrics(base, pass_k=[1, 2], resamples=1000)
    by = m["by_data_source"]
    assert set(by) == {"openai/gsm8k", "lighteval/MATH", "acme/capitals"}
    assert by["openai/gsm8k"]["mean_reward"] == 0.25  # strict, as compute_score scores it
    assert by["lighteval/MATH"]["mean_reward"] == 0.25
    assert by["acme/capitals"]["mean_reward"] == 0.25
    # GSM8K's strict and flexible scores on its rows only; n/a for the others.
    assert list(base["strict"][:4]) == [0, 1, 0, 0]
    assert list(base["flexible"][:4]) == [1, 1, 0, 1]
    assert base["strict"][4:].isna().all() and base["flexible"][4:].isna().all()
    # The strict format: a "#### <number>" answer, right ("#### 72") or wrong ("#### 11").
    assert list(base["strict_format"][:4]) == [0, 1, 1, 0]
    assert base["strict_format"][4:].isna().all()
    assert by["openai/gsm8k"]["strict_format_rate"] == 0.5
    assert by["acme/capitals"]["strict_format_rate"] is None
    assert by["openai/gsm8k"]["strict_accuracy"] == 0.25
    assert by["openai/gsm8k"]["flexible_accuracy"] == 0.75
    assert by["lighteval/MATH"]["strict_accuracy"] is None
    assert by["acme/capitals"]["flexible_accuracy"] is None
    assert m["strict_accuracy"] == 0.25 and m["gsm8k_prompts"] == 2  # not diluted by MATH
    # Answers for voting: GSM8K's number, MATH's last \boxed{} as verl normalises it (0.5
    # is \frac{1}{2}), the custom reward's pred.
    assert list(base["answer"]) == ["72", "72", "11", "10", "\\frac{1}{2}", "2", "4", "4",
                                    "paris", "lyon", "milan", "milan"]
    assert by["acme/capitals"]["maj_at_2"] == 0.5 and by["lighteval/MATH"]["maj_at_2"] == 0.5


def test_trained_versus_base_per_source(reward_file) -> None:
    base, trained = _score(BASE, "base", reward_file), _score(TRAINED, "trained", reward_file)
    assert list(trained["answer"][4:6]) == ["\\frac{1}{2}"] * 2  # \frac12 votes with it
    compared = compare_models(per_prompt_scores(base, [1, 2]),
                              per_prompt_scores(trained, [1, 2]), resamples=1000)
    by = compared["by_data_source"]
    assert by["openai/gsm8k"]["mean_reward"]["delta"] == 0.75  # 0.25 -> 1.0
    assert by["lighteval/MATH"]["mean_reward"]["delta"] == 0.5  # 0.25 -> 0.75
    assert by["acme/capitals"]["mean_reward"]["delta"] == 0.5  # 0.25 -> 0.75
    assert compared["mean_reward"]["delta"] == pytest.approx((0.75 + 0.5 + 0.5) / 3)
    assert compared["strict_accuracy"]["prompts"] == 2  # compared on GSM8K prompts only
    assert "strict_accuracy" not in by["lighteval/MATH"]
    for c in (compared["mean_reward"], *(v["mean_reward"] for v in by.values())):
        assert c["ci_low"] <= c["delta"] <= c["ci_high"]
        assert not math.isnan(c["sd_diff"])


def test_eval_reports_each_weighted_terms_mean_per_model() -> None:
    reward = eval_reward(RewardParams.model_validate({"terms": [
        {"name": "compute_score", "label": "correct"},
        {"name": "well_formed", "weight": 0.1, "label": "format"}]}))
    generations = [Generation(0, 0, "#### 72", tokens=5, truncated=False),
                   Generation(0, 1, "So 72.", tokens=5, truncated=False),
                   Generation(1, 0, "#### 11", tokens=5, truncated=False),
                   Generation(1, 1, "#### 10", tokens=5, truncated=False)]
    frame = score_generations(PROMPTS.iloc[:2], generations, "trained", reward, 64)
    assert frame["reward"].tolist() == pytest.approx([1.1, 0.0, 0.1, 1.1])
    metrics = model_metrics(frame, resamples=100)
    assert metrics["mean_term_correct"] == 0.5
    assert metrics["mean_term_format"] == 0.75


def test_a_right_answer_near_the_cap_is_right_whatever_the_overlong_penalty() -> None:
    """DAPO's overlong penalty lowered a right answer's reward (1.0 -> 0.25 at 44 of 48
    tokens), and pass@1 called the answer wrong: correctness is the function's own score."""
    prompts = PROMPTS.iloc[[4]].reset_index(drop=True)
    reward = eval_reward(RewardParams(custom_reward_function={"name": "compute_score"},
                                      overlong_buffer_len=16))
    data = [{**prompts.iloc[0].to_dict(), "data_source": "exact_match"}]
    frame = score_generations(pd.DataFrame(data), [
        Generation(0, 0, "Answer: Paris", tokens=44, truncated=False),
        Generation(0, 1, "Answer: Paris", tokens=20, truncated=False)], "trained", reward, 48)
    assert list(frame["reward"]) == [0.25, 1.0] and list(frame["function_score"]) == [1.0, 1.0]
    scores = per_prompt_scores(frame, pass_k=(1, 2))
    assert scores.loc[0, "pass_at_1"] == 1.0 and scores.loc[0, "maj_at_1"] == 1.0
    assert scores.loc[0, "mean_reward"] == 0.625  # the headline keeps the penalty
