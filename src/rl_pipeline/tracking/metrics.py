"""Numbers as MLflow metrics, in the shape kedro-mlflow's ``MlflowMetricsHistoryDataset``
saves: ``{name: {"value": float, "step": int}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten_numbers(values: Mapping[str, Any], sep: str = ".") -> dict[str, float]:
    """Nested numbers under joined names (``rows_out.train``, ``base/mean_reward``); booleans,
    text and None are left out."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update({f"{key}{sep}{name}": number
                        for name, number in flatten_numbers(value, sep).items()})
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[str(key)] = float(value)
    return out


def mlflow_metrics(values: Mapping[str, Any], sep: str = ".",
                   step: int = 0) -> dict[str, dict[str, float]]:
    """The numbers of ``values`` (nested allowed, see :func:`flatten_numbers`) at ``step``."""
    return {name: {"value": number, "step": step}
            for name, number in flatten_numbers(values, sep).items()}
