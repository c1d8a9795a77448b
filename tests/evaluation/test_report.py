"""Eval's chart: the numbers on its bars are the ones the report's table gives."""

from __future__ import annotations

from rl_pipeline.evaluation.report import HEADLINE, eval_chart


def test_the_charts_bar_labels_show_an_eval_of_200_prompts_exactly() -> None:
    # 49 and 139 of 200 prompts: two decimals drew 0.245 as 0.24 (0.245 is 0.24499... as a
    # float) beside a table that says 0.245.
    base = {k: 0.245 for k in HEADLINE} | {"mean_reward_ci_low": 0.19,
                                           "mean_reward_ci_high": 0.305, "by_data_source": {}}
    trained = {k: 0.695 for k in HEADLINE} | {"mean_reward_ci_low": 0.63,
                                              "mean_reward_ci_high": 0.76, "by_data_source": {},
                                              "vs_base": {"mean_reward": {
                                                  "delta": 0.45, "ci_low": 0.37, "ci_high": 0.53,
                                                  "distinguishable": True}}}
    figure = eval_chart({"base": base, "trained": trained})
    labels = [text.get_text() for text in figure.axes[0].texts]
    assert labels == ["0.245"] * len(HEADLINE) + ["0.695"] * len(HEADLINE)
