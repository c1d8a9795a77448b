"""A stage run before the stage it reads from: the check names what is missing and who writes it.

The project's own pipelines and catalog (conf/cpu), in a scratch project with nothing saved.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_pipeline.pipelines import eval as eval_stage
from rl_pipeline.pipelines import merge, promote, train
from rl_pipeline.runs.stage_inputs import StageInputError, check_stage_inputs, stage_outputs
from tests.projects import make_project, project_catalog


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A scratch project with nothing saved, as the working directory (catalog paths are
    relative to it)."""
    folder = make_project(tmp_path)
    monkeypatch.chdir(folder)
    return folder


def test_each_saved_dataset_is_written_by_the_stage_that_outputs_it() -> None:
    written = stage_outputs()
    assert written["train_prompts"] == written["val_prompts"] == "data_prep"
    assert written["training_result"] == "train"
    assert written["merged_model"] == "merge"
    assert written["eval_registry"] == "eval"
    assert written["promotion_decision"] == "promote"


def test_promote_before_eval_names_the_eval_stage_and_its_command(project) -> None:
    with pytest.raises(StageInputError) as raised:
        check_stage_inputs(promote.create_pipeline(), project_catalog(project), "cpu")
    message = str(raised.value)
    assert "  - eval_registry: written by the eval stage" in message
    assert "Run `kedro run --env cpu --pipelines eval` first" in message
    # Once eval has written it, promote may start (its own checks say the rest).
    (project / "data/08_reporting").mkdir(parents=True, exist_ok=True)
    (project / "data/08_reporting/eval_registry.json").write_text(json.dumps({}))
    check_stage_inputs(promote.create_pipeline(), project_catalog(project), "cpu")


def test_each_missing_input_is_named_and_the_earliest_stage_comes_first(project) -> None:
    with pytest.raises(StageInputError) as raised:
        check_stage_inputs(train.create_pipeline(), project_catalog(project), None)
    message = str(raised.value)
    assert "  - train_prompts: written by the data_prep stage" in message
    assert "  - val_prompts: written by the data_prep stage" in message
    # The default environment (local) needs no --env.
    assert "Run `kedro run --pipelines data_prep` first" in message
    # merge and promote together read what train and eval write: train is the one to run.
    with pytest.raises(StageInputError) as raised:
        check_stage_inputs(merge.create_pipeline() + promote.create_pipeline(),
                           project_catalog(project), "cpu")
    listed = [line for line in str(raised.value).splitlines() if line.startswith("  - ")]
    assert listed == ["  - eval_registry: written by the eval stage",
                      "  - training_result: written by the train stage"]
    assert "Run `kedro run --env cpu --pipelines train` first" in str(raised.value)


def test_an_input_a_stage_may_go_without_is_not_required(project) -> None:
    """eval evaluates the base model alone when no merged model was saved: only the prompts,
    which data_prep writes, are missing."""
    with pytest.raises(StageInputError) as raised:
        check_stage_inputs(eval_stage.create_pipeline(), project_catalog(project), "cpu")
    listed = [line for line in str(raised.value).splitlines() if line.startswith("  - ")]
    assert listed == ["  - val_prompts: written by the data_prep stage"]


def test_prompts_from_two_data_prep_runs_are_refused_as_a_pair(project) -> None:
    """data_prep saved new training prompts, then failed saving the validation prompts (a
    record's images field a number): preflight passed and train would have used the new
    training prompts with the old run's validation prompts."""
    import pandas as pd
    from kedro.io import Version

    from rl_pipeline.datasets.atomic import ParquetDataset
    from rl_pipeline.pipelines import preflight
    from rl_pipeline.runs.stage_inputs import MismatchedInputsError

    def saved(name: str, version: str) -> None:
        ParquetDataset(filepath=f"data/05_model_input/{name}.parquet",
                       version=Version(None, version)).save(pd.DataFrame({"a": [1]}))

    first, second = "2026-01-01T00.00.00.000Z", "2026-01-02T00.00.00.000Z"
    saved("train_prompts", first)
    saved("val_prompts", first)
    check_stage_inputs(train.create_pipeline(), project_catalog(project), "cpu")
    saved("train_prompts", second)  # the next data_prep stopped here
    for stage in (preflight, train):
        with pytest.raises(MismatchedInputsError) as raised:
            check_stage_inputs(stage.create_pipeline(), project_catalog(project), "cpu")
        message = str(raised.value)
        assert f"  - train_prompts_file: version {second}" in message
        assert f"  - val_prompts_file: version {first}" in message
        assert "Run `kedro run --env cpu --pipelines data_prep` again" in message
    saved("val_prompts", second)
    check_stage_inputs(train.create_pipeline(), project_catalog(project), "cpu")
