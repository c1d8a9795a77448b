"""Nodes of the merge pipeline. The node calls the Kedro-free ``rl_pipeline.merge``."""

from __future__ import annotations

from typing import Any

from rl_pipeline.config import MergeParams
from rl_pipeline.merge.standalone import make_standalone_model
from rl_pipeline.tracking import mlflow_metrics


def merge_model(lora_adapter: str | None, train_checkpoints: str | None, base_model: str,
                merge: MergeParams) -> tuple[str, dict[str, Any], dict[str, dict[str, float]]]:
    """Make a standalone model from the training result (the LoRA adapter, a fully fine-tuned
    model, or the newest verl checkpoint), verify it, and describe it.

    Returns:
        The merged model folder (moved into ``merged_model`` by the catalog), its metadata,
        and the verification numbers as MLflow metrics.
    """
    result = make_standalone_model(lora_adapter, train_checkpoints, base_model, merge)
    return str(result.path), result.metadata, mlflow_metrics(result.numbers)
