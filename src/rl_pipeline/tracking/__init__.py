"""What MLflow records about a run besides its outputs: numbers in the shape kedro-mlflow's
metrics dataset saves (:mod:`.metrics`) and the lineage that ties runs, data versions and
weights together (:mod:`.lineage`)."""

from rl_pipeline.tracking.metrics import flatten_numbers, mlflow_metrics

# MLflow draws a download bar whenever it reads an artifact back: log_table appends each
# training step's rollouts to the table so far, promote reads eval's evidence. A bar per
# step is noise in a stage's log, so every process of a run turns it off (hooks.py, and
# verl's Ray workers through their runtime environment).
ARTIFACTS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"

__all__ = ["ARTIFACTS_BAR_ENV", "flatten_numbers", "mlflow_metrics"]
