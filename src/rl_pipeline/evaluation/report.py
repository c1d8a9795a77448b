"""The eval report: a side-by-side Markdown table with deltas and a bar chart."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: schedulers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

HEADLINE = ("strict_accuracy", "flexible_accuracy", "mean_reward", "strict_pass_at_1")


def markdown_report(metrics: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    """A Markdown report: settings, then every metric side by side with the delta."""
    labels = list(metrics)
    keys = [k for k in metrics[labels[0]] if not isinstance(metrics[labels[0]][k], dict)]
    head = "| metric | " + " | ".join(labels) + (" | delta |" if len(labels) == 2 else " |")
    lines = ["# Evaluation: base versus trained", "",
             *(f"- {k}: {v}" for k, v in settings.items()), "", head,
             "|" + "---|" * (len(labels) + 1 + (len(labels) == 2))]
    for key in keys:
        values = [metrics[label].get(key) for label in labels]
        cells = [_fmt(v) for v in values]
        if len(labels) == 2 and all(isinstance(v, int | float) for v in values):
            cells.append(f"{values[1] - values[0]:+.4g}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if len(labels) == 1:
        lines += ["", "No trained model yet (catalog entry `merged_model` is empty): run the "
                  "train and merge stages, then eval again."]
    for label in labels:
        for source, values in metrics[label].get("by_data_source", {}).items():
            lines += ["", f"## {label}: {source}", "",
                      *(f"- {k}: {_fmt(v)}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def bar_chart(metrics: dict[str, dict[str, Any]]) -> Figure:
    """Grouped bars of the headline metrics per model."""
    labels = list(metrics)
    keys = [k for k in HEADLINE if all(k in metrics[label] for label in labels)]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    x = np.arange(len(keys))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = [metrics[label][k] for k in keys]
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, values, width, label=label)
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
    ax.set_xticks(x, keys)
    ax.set_ylim(0, max(1.0, max(metrics[label][k] for label in labels for k in keys) * 1.1))
    ax.set_title("Base versus trained")
    ax.legend()
    fig.tight_layout()
    plt.close(fig)
    return fig


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
