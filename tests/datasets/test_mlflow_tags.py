"""Each stage tags its own MLflow run: a node returns ``<stage>_run_tags`` and the project's
catalog pattern sets them on the active run (rl_pipeline.datasets.mlflow_tags)."""

from __future__ import annotations

import mlflow
import pytest
import yaml
from kedro.io import DataCatalog, DatasetError
from kedro.pipeline import Node, Pipeline
from kedro.runner import SequentialRunner

from rl_pipeline.model_registry.names import TAG_LIMIT
from rl_pipeline.pipelines.promote.nodes import promote_run_tags
from rl_pipeline.pipelines.train.nodes import train_run_tags
from tests.conftest import PROJECT_ROOT

DECISION = {"promoted": False, "changed": True, "candidate": "3", "reference": "champion:2",
            "reasons": ["mean_reward +0.010 within the paired 95% interval", "x" * 6000]}


def _project_catalog() -> DataCatalog:
    """The project's own run-tags pattern, as conf/base/catalog.yml declares it."""
    entries = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text())
    return DataCatalog.from_config({k: v for k, v in entries.items() if "run_tags" in k})


def test_a_stage_node_tags_its_own_run_through_the_catalog(mlflow_store) -> None:
    pipeline = Pipeline([Node(promote_run_tags, "promotion_decision", "promote_run_tags")])
    catalog = _project_catalog()
    catalog["promotion_decision"] = DECISION
    with mlflow.start_run() as run:
        SequentialRunner().run(pipeline, catalog)
    tags = mlflow.MlflowClient().get_run(run.info.run_id).data.tags
    assert (tags["promote.promoted"], tags["promote.changed"]) == ("false", "true")
    assert (tags["promote.candidate"], tags["promote.compared_with"]) == ("3", "champion:2")
    assert tags["promote.reasons"].startswith("mean_reward +0.010 within")
    assert len(tags["promote.reasons"]) == TAG_LIMIT  # cut to what MLflow stores


def test_without_a_run_nothing_is_tagged_and_a_non_mapping_is_refused(mlflow_store) -> None:
    dataset = _project_catalog().get("train_run_tags")
    tags = train_run_tags({"engine": "trl", "hardware": {"gpus": 0}},
                          {"identity": "a" * 64, "resumed": False})
    assert tags["train.engine"] == "trl" and tags["train.hardware.gpus"] == 0
    assert tags["train.resumed"] == "false" and tags["train.weights_run_id"] == "none"
    dataset.save(tags)  # no active run: a bare runner, or tracking off
    assert mlflow.search_runs(search_all_experiments=True).empty
    with pytest.raises(DatasetError, match="mapping of names to values, got list"):
        dataset.save(["train.engine"])
