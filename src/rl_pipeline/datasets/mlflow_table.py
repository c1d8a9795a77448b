"""A table artifact of the active MLflow run (``mlflow.log_table``): the MLflow UI shows it
in the run's artifacts and ``mlflow.load_table`` reads it back."""

from __future__ import annotations

import logging
from typing import Any

import mlflow
import pandas as pd
from kedro.io import AbstractDataset, DatasetError

logger = logging.getLogger(__name__)


class MlflowTableDataset(AbstractDataset[pd.DataFrame, pd.DataFrame]):
    """A table artifact of the active MLflow run (kedro-mlflow opens one per stage).

    Saving without an active run logs nothing (MLflow tracking is off, or a bare runner in a
    test): the same rows are in the ``eval_generations`` Parquet file.
    """

    def __init__(self, artifact_file: str, run_id: str | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        """
        Args:
            artifact_file: The path in the run's artifacts, ``.json`` (what the UI shows).
            run_id: The run to load from; None: the active run.
        """
        if not artifact_file.endswith(".json"):
            raise DatasetError(f"artifact_file={artifact_file!r}: an MLflow table the UI "
                               "shows is a .json artifact")
        self.artifact_file = artifact_file
        self.run_id = run_id
        self.metadata = metadata
        # kedro-mlflow switches this off for pipelines its mlflow.yml does not track, as it
        # does for its own Mlflow* datasets.
        self._logging_activated = True

    def save(self, data: pd.DataFrame) -> None:
        if mlflow.active_run() is None or not self._logging_activated:
            logger.info("No MLflow run to log to: table %s not logged", self.artifact_file)
            return
        # log_table appends to a table of that name already in the run; each stage runs in
        # a run of its own (a retry too), so the eval table is logged once per run.
        mlflow.log_table(data, artifact_file=self.artifact_file)

    def load(self) -> pd.DataFrame:
        run_id = self.run_id or (run.info.run_id if (run := mlflow.active_run()) else None)
        if run_id is None:
            raise DatasetError(f"loading {self.artifact_file} needs a run_id or an active "
                               "MLflow run")
        return mlflow.load_table(self.artifact_file, run_ids=[run_id])

    def _describe(self) -> dict[str, Any]:
        return {"artifact_file": self.artifact_file, "run_id": self.run_id}
