"""Nodes of the merge pipeline. The node calls the Kedro-free ``rl_pipeline.merge``."""

from __future__ import annotations

from typing import Any

from rl_pipeline.merge.standalone import make_standalone_model
from rl_pipeline.params import MergeParams
from rl_pipeline.tracking import mlflow_metrics


def merge_model(training_result: str, base_model: str, merge: MergeParams,
                ) -> tuple[str, dict[str, Any], dict[str, dict[str, float]]]:
    """Make a standalone model from the training result (a peft adapter or a whole model,
    as its record says), verify it, and describe it.

    Returns:
        The merged model folder (moved into ``merged_model`` by the catalog), its metadata,
        and the verification numbers as MLflow metrics.
    """
    result = make_standalone_model(training_result, base_model, merge)
    return str(result.path), result.metadata, mlflow_metrics(result.numbers)
