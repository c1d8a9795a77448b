"""`kedro run` splits a request for several whole stages into one session per stage."""

from __future__ import annotations

from rl_pipeline.cli import stages_to_run
from rl_pipeline.pipeline_registry import STAGES


def test_the_default_pipeline_runs_each_stage_in_order() -> None:
    assert stages_to_run(None, [], {}) == list(STAGES) == ["data_prep", "train", "merge", "eval"]
    assert stages_to_run("__default__", [], {}) == list(STAGES)
    # --pipelines takes any order (Kedro keeps a set); stages still run in pipeline order.
    assert stages_to_run(None, ["eval", "data_prep"], {}) == ["data_prep", "eval"]


def test_one_stage_other_pipelines_and_node_filters_run_as_kedro_does() -> None:
    assert stages_to_run("train", [], {}) is None
    assert stages_to_run(None, ["preflight"], {}) is None
    assert stages_to_run(None, ["data_prep", "preflight"], {}) is None
    assert stages_to_run(None, [], {"from_nodes": ["merge_model_node"]}) is None
    assert stages_to_run(None, [], {"tags": ("x",), "node_names": ()}) is None
    assert stages_to_run(None, [], {"tags": (), "node_names": ()}) == list(STAGES)
