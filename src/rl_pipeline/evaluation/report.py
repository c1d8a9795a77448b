"""The eval report: the verdict first, then Markdown tables side by side with deltas and
their 95% intervals, the difference in words (distinguishable from noise or not), example
answers side by side, and the charts; the settings it names and the metrics as MLflow
keeps them."""

from __future__ import annotations

import textwrap
from typing import Any

import matplotlib

from rl_pipeline.evaluation.examples import examples_markdown
from rl_pipeline.evaluation.generate import pick_backend, sampling_settings
from rl_pipeline.evaluation.metrics import usable_k
from rl_pipeline.evaluation.significance import signs_disagree
from rl_pipeline.evaluation.verdict import RULE
from rl_pipeline.params import DataParams, EvalParams, RewardParams
from rl_pipeline.params.model_registry import FEW_PROMPTS
from rl_pipeline.rewards.scoring import GSM8K_SOURCES

matplotlib.use("Agg")  # headless: schedulers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# The overall bars of the chart; the headline (the configured reward) first.
HEADLINE = ("mean_reward", "pass_at_1", "maj_at_1", "strict_accuracy", "flexible_accuracy",
            "strict_format_rate")
ALL = "all prompts"
# Per-model keys that the tables leave out: the headline's interval is in the chart.
_HIDDEN = ("mean_reward_ci_low", "mean_reward_ci_high")


def markdown_report(metrics: dict[str, dict[str, Any]], settings: dict[str, Any],
                    examples: list[dict[str, Any]] | None = None) -> str:
    """The Markdown report.

    Args:
        metrics: Per model label (``base``, then ``trained`` when there is one), as
            :func:`~rl_pipeline.evaluation.metrics.model_metrics` returns them; the trained
            model's ``vs_base`` (and its sources') hold the paired comparisons, its
            ``verdict`` the :class:`~rl_pipeline.evaluation.verdict.Verdict`.
        settings: What was run, in order (backend, decoding, the headline reward...).
        examples: :func:`~rl_pipeline.evaluation.examples.pick_examples`.
    """
    labels = list(metrics)
    lines = ["# Evaluation: base versus trained", ""]
    if len(labels) > 1:
        lines += [*_verdict_lines(metrics["trained"]["verdict"]), ""]
    lines += ["## Settings", "", *(f"- {k}: {v}" for k, v in settings.items()), "",
              "## Metrics", "", *_metric_table(metrics, labels)]
    if len(labels) == 1:
        lines += ["", "No trained model yet (catalog entry `merged_model` is empty): run the "
                  "train and merge stages, then eval again."]
    else:
        lines += ["", "## Is the difference real?", "", *_in_words(metrics),
                  "", "## Examples: base and trained answers", "",
                  *examples_markdown(examples or [])]
    lines += ["", "## Headline by data source", "", *_source_table(metrics, labels)]
    for source in metrics[labels[0]]["by_data_source"]:
        lines += ["", f"## Data source: {source}", "",
                  *_metric_table({label: metrics[label]["by_data_source"][source]
                                  for label in labels}, labels)]
    return "\n".join(lines) + "\n"


def _verdict_lines(verdict: dict[str, Any]) -> list[str]:
    lines = [f"**Verdict: {verdict['verdict']}.** {'; '.join(verdict['reasons'])}.", ""]
    if len(verdict["by_data_source"]) > 1:
        lines += [f"- {source}: {v['verdict']}" for source, v in
                  verdict["by_data_source"].items()] + [""]
    return lines + [RULE]


def _metric_table(metrics: dict[str, dict[str, Any]], labels: list[str]) -> list[str]:
    first = metrics[labels[0]]
    keys = [k for k in first if not isinstance(first[k], dict) and k not in _HIDDEN]
    if len(labels) == 1:
        return [f"| metric | {labels[0]} |", "|---|---|",
                *(f"| {_name(k)} | {_fmt(first[k])} |" for k in keys)]
    compared = metrics[labels[1]].get("vs_base", {})
    out = [f"| metric | {labels[0]} | {labels[1]} | delta | 95% interval | distinguishable "
           "| prompts needed |", "|---|---|---|---|---|---|---|"]
    for key in keys:
        values = [metrics[label].get(key) for label in labels]
        cells = [_fmt(v) for v in values]
        if key in compared:
            c = compared[key]
            cells += [f"{c['delta']:+.4g}", _interval(c), "yes" if c["distinguishable"] else
                      "no", _fmt(c["prompts_needed"])]
        elif key not in ("prompts", "gsm8k_prompts", "samples_per_prompt") and \
                all(isinstance(v, int | float) for v in values):
            cells += [f"{values[1] - values[0]:+.4g}", "", "", ""]
        else:
            cells += ["", "", "", ""]
        out.append(f"| {_name(key)} | " + " | ".join(cells) + " |")
    return out


def _source_table(metrics: dict[str, dict[str, Any]], labels: list[str]) -> list[str]:
    rows = {group: [_groups(metrics[label])[group] for label in labels]
            for group in _groups(metrics[labels[0]])}
    head = "| data source | prompts | " + " | ".join(labels)
    if len(labels) == 1:
        return [head + " |", "|---|---|---|",
                *(f"| {s} | {v[0]['prompts']} | {_fmt(v[0]['mean_reward'])} |"
                  for s, v in rows.items())]
    out = [head + " | delta | 95% interval | distinguishable | prompts needed |",
           "|---|---|---|---|---|---|---|---|"]
    for source, values in rows.items():
        c = values[1]["vs_base"]["mean_reward"]
        out.append(f"| {source} | {values[0]['prompts']} | {_fmt(values[0]['mean_reward'])} | "
                   f"{_fmt(values[1]['mean_reward'])} | {c['delta']:+.4g} | {_interval(c)} | "
                   f"{'yes' if c['distinguishable'] else 'no'} | {_fmt(c['prompts_needed'])} |")
    return out


def _in_words(metrics: dict[str, dict[str, Any]]) -> list[str]:
    """The headline's change, over all prompts and per source, and whether it is noise."""
    trained = metrics["trained"]
    out = []
    for name, values in _groups(trained).items():
        c = values["vs_base"]["mean_reward"]
        out.append(f"- **{name}** ({c['prompts']} prompts): {_sentence(c)}")
    others = {k: c for k, c in trained["vs_base"].items() if k != "mean_reward"}
    real = [f"{_name(k)} ({c['delta']:+.3g})" for k, c in others.items() if c["distinguishable"]]
    if not others:
        summary = "none compared"
    elif not real:
        summary = "none beyond noise"
    else:
        summary = f"beyond noise for {', '.join(real)}" + (
            "; not for the others" if len(real) < len(others) else "")
    out += ["", f"Other accuracy metrics: {summary} (table above).",
            "", "Intervals: paired bootstrap over prompts (the same resampled prompts for both "
            "models), percentiles 2.5 and 97.5; a change is beyond noise (distinguishable) "
            "where its interval excludes 0 and an exact sign test of the prompts that changed "
            "agrees (p < 0.05; McNemar's exact test for 0/1 scores). Prompts needed: "
            "n = (1.96 sd / |delta|)^2, sd the standard deviation of the per-prompt "
            "differences, the eval size at which the expected interval just reaches 0, so "
            "a true difference of this size shows about half the time; "
            "((1.96 + 0.84) sd / |delta|)^2 for an 80% chance."]
    return out


def _sentence(c: dict[str, Any]) -> str:
    change = (f"the headline changed by {c['delta']:+.4g}, 95% interval {_interval(c)}"
              if abs(c["delta"]) >= 1e-12 else
              f"no change in the headline, 95% interval {_interval(c)}")
    if c["distinguishable"]:
        verdict = (f"The interval excludes 0: at {c['prompts']} prompts the change is "
                   "distinguishable from noise.")
    elif c["ci_low"] > 0 or c["ci_high"] < 0:
        verdict = (f"The interval excludes 0, but {signs_disagree(c)}; at {c['prompts']} "
                   "prompts the change is not distinguishable from noise.")
    else:
        verdict = (f"The interval includes 0: at {c['prompts']} prompts the change is not "
                   "distinguishable from noise.")
    if c["prompts"] < FEW_PROMPTS:
        verdict += (f" With fewer than {FEW_PROMPTS} prompts a bootstrap interval is too "
                    "narrow (it sees only the differences these prompts happen to show): "
                    "read it as a rough indication.")
    if c["prompts_needed"] is None:
        return f"{change}. {verdict}"
    return (f"{change}. {verdict} A difference of this size needs about "
            f"{_prompts(c['prompts_needed'])} to show half the time, about "
            f"{_prompts(c['prompts_needed_80'])} for an 80% chance (standard deviation of "
            f"the per-prompt differences {c['sd_diff']:.3g}).")


def _prompts(n: int) -> str:
    return f"{n} prompt{'' if n == 1 else 's'}"


def eval_chart(metrics: dict[str, dict[str, Any]]) -> Figure:
    """The overall metrics per model; the headline per data source with each model's 95%
    interval; and, with a trained model, the delta per source with its paired interval."""
    labels = list(metrics)
    panels = 3 if len(labels) == 2 else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8), dpi=100)
    _overall_bars(axes[0], metrics, labels)
    by_group = {label: _groups(metrics[label]) for label in labels}
    groups = list(by_group[labels[0]])
    x = np.arange(len(groups))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = np.array([by_group[label][g]["mean_reward"] for g in groups])
        low = np.array([by_group[label][g]["mean_reward_ci_low"] for g in groups])
        high = np.array([by_group[label][g]["mean_reward_ci_high"] for g in groups])
        # No value labels: the error bars run through them; the report has the numbers.
        axes[1].bar(x + (i - (len(labels) - 1) / 2) * width, values, width, label=label,
                    yerr=[values - low, high - values], capsize=4)
    axes[1].set_xticks(x, _wrapped(groups))
    axes[1].set_title("Headline (reward) per data source, 95% intervals")
    axes[1].set_ylabel("mean reward")
    _legend_above_bars(axes[1], max([1.0] + [by_group[label][g]["mean_reward_ci_high"]
                                             for label in labels for g in groups]))
    if panels == 3:
        compared = [by_group["trained"][g]["vs_base"]["mean_reward"] for g in groups]
        delta = np.array([c["delta"] for c in compared])
        errors = [delta - [c["ci_low"] for c in compared],
                  np.array([c["ci_high"] for c in compared]) - delta]
        colours = ["tab:green" if c["distinguishable"] else "tab:gray" for c in compared]
        axes[2].bar(x, delta, 0.6, yerr=errors, capsize=4, color=colours)
        axes[2].axhline(0, color="black", linewidth=0.8)
        axes[2].set_xticks(x, _wrapped(groups))
        axes[2].set_title("Trained - base, paired 95% interval\n(green: beyond noise)")
        axes[2].set_ylabel("delta of the mean reward")
    fig.tight_layout()
    plt.close(fig)
    return fig


def _groups(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One model's metrics over all prompts, then per data source."""
    return {ALL: model, **model["by_data_source"]}


def _overall_bars(ax: Any, metrics: dict[str, dict[str, Any]], labels: list[str]) -> None:
    keys = [k for k in HEADLINE if all(metrics[label].get(k) is not None for label in labels)]
    x = np.arange(len(keys))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width,
                      [metrics[label][k] for k in keys], width, label=label)
        # Three significant digits, as the report's table has them (two decimals showed
        # 0.245 as 0.24); upright where two bars share a metric, turned where three do, so
        # that neighbours' labels do not run into each other.
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2,
                     rotation=0 if len(labels) <= 2 else 90)
    # Upright and wrapped: six names side by side in one panel overlapped at any angle.
    ax.set_xticks(x, [textwrap.fill(_name(k).replace("_", " "), 11) for k in keys],
                  fontsize=9)
    top = max([metrics[label][k] for label in labels for k in keys] or [1.0])
    _legend_above_bars(ax, max(1.0, top))
    ax.set_title("Base versus trained, all prompts")


def _legend_above_bars(ax: Any, top: float) -> None:
    """The legend in a band above the tallest bar, where it covers no bar or label."""
    ax.set_ylim(0, top * 1.25)
    ax.legend(loc="upper center", ncols=3, frameon=False, fontsize=8)


def _wrapped(names: list[str]) -> list[str]:
    return [n.replace("/", "/\n") for n in names]


def _name(key: str) -> str:
    """``pass_at_4`` -> ``pass@4``; the headline says that it is."""
    if key == "mean_reward":
        return "mean_reward (headline)"
    return key.replace("_at_", "@")


def _interval(c: dict[str, Any]) -> str:
    return f"[{c['ci_low']:+.4g}, {c['ci_high']:+.4g}]"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def report_settings(params: EvalParams, shared: DataParams, reward: RewardParams,
                    base: dict[str, Any], selection: dict[str, int] | None = None,
                    ) -> dict[str, Any]:
    """What the report names: back end, decoding, the prompts (of the validation prompts,
    as ``selection`` says they were chosen), the headline, k, intervals."""
    sampling = sampling_settings(params, shared)
    n = sampling.samples
    if params.greedy:
        decoding = "greedy (argmax, temperature 0), 1 sample per prompt"
    else:
        top_k = "off" if sampling.top_k < 0 else sampling.top_k
        decoding = (f"sampled (temperature {sampling.temperature}, top_p {sampling.top_p}, "
                    f"top_k {top_k}), n = {n} sample{'s' if n > 1 else ''} per prompt")
    used, skipped = usable_k(params.pass_k, n)
    ks = ", ".join(map(str, used)) or "none"
    if skipped:
        ks += (f"; skipped k = {', '.join(map(str, skipped))}: more than the {n} sample"
               f"{'s' if n > 1 else ''} per prompt")
    fn = reward.custom_reward_function
    sources = ", ".join(f"{s} {v['prompts']}" for s, v in base["by_data_source"].items())
    return {
        "backend": pick_backend(params.backend),
        "decoding": decoding,
        "max new tokens": sampling.max_new_tokens,
        "prompts": f"{base['prompts']} ({sources}){_chosen(selection)}",
        "headline": f"the reward `{fn.name}`{f' from {fn.path}' if fn.path else ''} (the reward "
        "group's function, as in training, by data_source), mean@n over samples; a sample "
        "is correct for pass@k and maj@k when its reward is at least "
        f"{params.correct_reward}",
        "pass@k, maj@k": f"k = {ks}",
        "strict, flexible": "lm-evaluation-harness gsm8k (strict-match: the number after the "
        "first '#### '; flexible-extract: the last number), on the GSM8K-style data sources "
        f"{', '.join(sorted(GSM8K_SOURCES))} only ({base['gsm8k_prompts']} prompts); n/a "
        "elsewhere; strict format rate: the share of responses with a '#### <number>' answer, "
        "right or wrong",
        "degeneration": "truncation (hit the token cap), repetition (a line 3 times, or half "
        "the word 4-grams repeated), no reasoning (under 3 words or no number before the "
        "answer): docs/rewards.md",
        "intervals": f"95%, paired bootstrap over prompts, {params.bootstrap_resamples} "
        f"resamples, seed {params.seed}",
    }


def for_mlflow(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics less the comparisons' bookkeeping (one MLflow call per number): a delta
    keeps its interval and the prompts it would need."""
    kept = ("delta", "ci_low", "ci_high", "prompts_needed")

    def trim(values: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in values.items():
            if key.startswith("vs_"):
                value = {m: {k: c[k] for k in kept} for m, c in value.items()}
            elif isinstance(value, dict):
                value = trim(value)
            out[key] = value
        return out

    return trim(metrics)


def _chosen(selection: dict[str, int] | None) -> str:
    """Which of the validation prompts were evaluated, when not all of them."""
    if not selection or selection["evaluated"] == selection["validation_prompts"]:
        return ""
    of, left_out = selection["validation_prompts"], selection["trained_on_prompts"]
    parts = [f" of the {of} validation prompts"]
    if left_out:
        parts.append(f"; {left_out} left out because the trained model was trained on them")
    if selection["evaluated"] < of - left_out:
        parts.append("; eval.max_prompts cut the rest: a quick check, no evidence for the "
                     "promotion gate")
    return "".join(parts)


def champion_lines(trained: dict[str, Any], left_out: int = 0) -> list[str]:
    """The report's section on the promotion gate's reference: trained - champion, paired
    (``left_out``: the prompts left out because the champion was trained on them)."""
    lines = ["## Against the champion (the promotion gate's reference)", ""]
    if left_out:
        lines += [f"On the prompts the champion was not trained on: {left_out} of them it "
                  "was trained on are left out.", ""]
    lines += ["| metric | delta | 95% interval |", "|---|---|---|"]
    for metric, c in trained.get("vs_champion", {}).items():
        if isinstance(c, dict) and "ci_low" in c:
            lines.append(f"| {_name(metric)} | {c['delta']:+.3f} | {_interval(c)} |")
    return lines
