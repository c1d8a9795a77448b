"""Tags of the active MLflow run: a stage's node returns what identifies its run (the engine,
the verdict, the promotion decision) as a mapping, and the catalog sets it, so that the node
stays a pure function and the hooks keep only what every stage tags."""

from __future__ import annotations

import logging
from typing import Any

import mlflow
from kedro.io import AbstractDataset, DatasetError

from rl_pipeline.model_registry.names import tag_value

logger = logging.getLogger(__name__)


class MlflowTagsDataset(AbstractDataset[dict[str, Any], dict[str, str]]):
    """Tags of the active MLflow run (kedro-mlflow opens one per stage).

    Values are stored as text (anything else as JSON), cut to MLflow's tag limit. Saving
    without an active run sets nothing (tracking off, or a bare runner in a test). Loading
    reads the active run's tags.
    """

    def __init__(self, metadata: dict[str, Any] | None = None) -> None:
        self.metadata = metadata
        # kedro-mlflow switches this off for pipelines its mlflow.yml does not track, as it
        # does for its own Mlflow* datasets (it matches the class name's prefix).
        self._logging_activated = True

    def save(self, data: dict[str, Any]) -> None:
        if not isinstance(data, dict):
            raise DatasetError(f"run tags are a mapping of names to values, got "
                               f"{type(data).__name__}")
        if mlflow.active_run() is None or not self._logging_activated:
            logger.info("No MLflow run to tag: %s not set", ", ".join(data) or "nothing")
            return
        mlflow.set_tags({name: tag_value(value) for name, value in data.items()})

    def load(self) -> dict[str, str]:
        run = mlflow.active_run()
        if run is None:
            raise DatasetError("run tags are read from the active MLflow run; there is none")
        return dict(mlflow.MlflowClient().get_run(run.info.run_id).data.tags)

    def _describe(self) -> dict[str, Any]:
        return {}
