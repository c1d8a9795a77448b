"""The data_prep report: counts, prompt-length statistics and a length histogram."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: schedulers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def length_stats(lengths: np.ndarray, sample: np.ndarray) -> dict[str, Any]:
    """Percentiles of prompt tokens over the exactly counted sample, max over all exact counts."""
    measured = lengths[sample]
    if measured.size == 0:
        return {"p50": 0, "p90": 0, "p99": 0, "max": 0, "rows_measured": 0, "sampled": False}
    p50, p90, p99 = np.percentile(measured, [50, 90, 99])
    return {
        "p50": float(p50), "p90": float(p90), "p99": float(p99),
        "max": int(lengths.max()),
        "rows_measured": int(measured.size),
        "sampled": bool(measured.size < lengths.size),
    }


def length_histogram(samples: dict[str, np.ndarray], limit: int) -> Figure:
    """Histogram of prompt token lengths per split, with the length limit drawn."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    everything = np.concatenate([s for s in samples.values() if s.size] or [np.zeros(1)])
    top = max(int(everything.max()), limit)
    bins = np.linspace(0, top * 1.05, 60)
    for split, values in samples.items():
        ax.hist(values, bins=bins, alpha=0.6, label=f"{split} (n={values.size})")
    ax.axvline(limit, color="crimson", linestyle="--", linewidth=1.5,
               label=f"data_max_prompt_length = {limit}")
    ax.set_xlabel("prompt tokens (chat template + generation prompt)")
    ax.set_ylabel("prompts")
    ax.set_title("Prompt lengths")
    ax.legend()
    fig.tight_layout()
    plt.close(fig)  # the dataset saves it; keep pyplot's registry from growing
    return fig
