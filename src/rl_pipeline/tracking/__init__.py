"""What MLflow records about a run besides its outputs: numbers in the shape kedro-mlflow's
metrics dataset saves (:mod:`.metrics`) and the lineage that ties runs, data versions and
weights together (:mod:`.lineage`)."""

from rl_pipeline.tracking.metrics import flatten_numbers, mlflow_metrics

__all__ = ["flatten_numbers", "mlflow_metrics"]
