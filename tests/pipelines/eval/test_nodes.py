"""summarize_eval on scored generations made by hand: the report says in words whether a
difference is distinguishable from noise, names the decoding, and the chart has intervals."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import ErrorbarContainer

from rl_pipeline.evaluation.generate import Generation
from rl_pipeline.evaluation.scoring import eval_reward, score_generations
from rl_pipeline.params import DataParams, EvalParams, RewardParams, resolve_followers
from rl_pipeline.pipelines.eval.nodes import summarize_eval
from tests.conftest import gsm8k_prompts

PROMPTS = gsm8k_prompts(32)
# As a run hands it to eval's nodes: its followers resolved from data and reward.
GREEDY = resolve_followers({"eval": EvalParams(backend="hf", greedy=True, bootstrap_resamples=2000),
                            "data": DataParams(), "reward": RewardParams()})["eval"]


def _scored(right: range, label: str) -> pd.DataFrame:
    """One greedy answer per prompt, right on the prompts in ``right``."""
    truths = [row["ground_truth"] for row in PROMPTS["reward_model"]]
    generations = [Generation(p, 0, f"#### {truths[p] if p in right else -1}", 4, False)
                   for p in range(len(PROMPTS))]
    return score_generations(PROMPTS, generations, label, eval_reward(RewardParams()), 64)


def _summary(base_right: range, trained_right: range) -> tuple[dict, str, object]:
    _, _, metrics, _, report, chart = summarize_eval(
        _scored(base_right, "base"), _scored(trained_right, "trained"), pd.DataFrame(), GREEDY,
        DataParams(), RewardParams())
    return metrics, report, chart


def test_equal_scores_on_32_prompts_are_not_distinguishable() -> None:
    metrics, report, _ = _summary(range(0, 16), range(8, 24))
    c = metrics["trained"]["vs_base"]["mean_reward"]
    assert c["delta"] == 0 and c["ci_low"] < 0 < c["ci_high"] and not c["distinguishable"]
    assert "no change in the headline" in report
    assert "at 32 prompts the change is not distinguishable from noise" in report
    # Greedy is named, and the k that one sample cannot give are skipped, with the reason.
    assert "greedy (argmax, temperature 0), 1 sample per prompt" in report
    assert "k = 1; skipped k = 4, 8: more than the 1 sample per prompt" in report


def test_a_large_gain_is_distinguishable_and_charted_with_intervals() -> None:
    metrics, report, chart = _summary(range(0, 8), range(0, 28))
    c = metrics["trained"]["vs_base"]["mean_reward"]
    assert c["delta"] == 0.625 and c["distinguishable"] and c["prompts_needed"] < 32
    assert "the headline changed by +0.625" in report
    assert "at 32 prompts the change is distinguishable from noise" in report
    assert "rough indication" not in report  # 32 prompts are enough for the bootstrap
    assert f"needs about {c['prompts_needed']} prompts to show half the time" in report
    assert "| openai/gsm8k | 32 | 0.25 | 0.875 | +0.625 |" in report
    overall, per_source, deltas = chart.axes
    assert any(isinstance(c, ErrorbarContainer) for c in per_source.containers)
    assert any(isinstance(c, ErrorbarContainer) for c in deltas.containers)
    # Readable: no value label, metric name or legend runs into another.
    FigureCanvasAgg(chart).draw()  # as the PNG is rendered
    renderer = chart.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in [*overall.texts, *overall.get_xticklabels()]
             if t.get_text()] + [overall.get_legend().get_window_extent(renderer)]
    assert len(boxes) == 12 + 6 + 1
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]


def test_the_trained_model_is_compared_with_the_champion_on_the_same_prompts() -> None:
    _, _, metrics, _, report, _ = summarize_eval(
        _scored(range(0, 8), "base"), _scored(range(0, 28), "trained"),
        _scored(range(0, 20), "champion"), GREEDY, DataParams(), RewardParams())
    trained = metrics["trained"]
    # Paired, like vs_base: trained 28/32 right against the champion's 20/32.
    assert trained["vs_champion"]["mean_reward"]["delta"] == 0.25
    assert trained["vs_base"]["mean_reward"]["delta"] == 0.625
    assert trained["by_data_source"]["openai/gsm8k"]["vs_champion"]["mean_reward"]["delta"] \
        == 0.25
    assert metrics["champion"]["mean_reward"] == 0.625
    assert "## Against the champion (the promotion gate's reference)" in report
    assert "| mean_reward (headline) | +0.250 | [+0.125, +0.4062] |" in report


def test_the_champion_is_compared_only_where_it_was_not_trained() -> None:
    # The champion trained on the first 8 questions: evaluate_champion answered the other 24,
    # at their positions among the prompts.
    champion = _scored(range(0, 20), "champion")
    champion = champion[champion["prompt_index"] >= 8]
    _, _, metrics, _, report, _ = summarize_eval(
        _scored(range(0, 8), "base"), _scored(range(0, 28), "trained"), champion, GREEDY,
        DataParams(), RewardParams())
    # On prompts 8-31: the trained model right on 20, the champion on 12.
    compared = metrics["trained"]["vs_champion"]["mean_reward"]
    assert compared["delta"] == pytest.approx(8 / 24) and compared["prompts"] == 24
    assert metrics["trained"]["vs_base"]["mean_reward"]["prompts"] == 32
    assert "8 of them it was trained on are left out" in report
