"""Faults and concurrency in real `kedro run` processes.

A run is stopped at an exact point (tests/fault_injection: just as it opens a file for
writing, or just before it renames a finished file into place), then killed with SIGKILL,
as the out-of-memory killer or a power cut would. Whatever the point, every catalog entry
must still load a complete version, never the half-written one, and the next run of the
stage must succeed. Runs use the tiny model, so each takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from kedro.io import DatasetError

from tests.mounts import fill, remount_read_only, tmpfs
from tests.projects import (
    StoppedRun,
    kedro_command,
    kedro_run,
    make_project,
    mlflow_runs,
    project_catalog,
)

pytestmark = pytest.mark.slow

# data.data_max_response_length caps both training and eval responses.
TRAIN = "train.trl.max_steps=1,data.data_max_response_length=4,train.trl.save_steps=1"
EVAL = "eval.max_prompts=2"


def _ok(result) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> tuple[Path, str]:
    """A project whose data_prep and train (trl, one step) ran, and its --params."""
    project = make_project(tmp_path_factory.mktemp("faults"))
    params = f"base_model={tiny_model_dir},{TRAIN},{EVAL}"
    for stage in ("data_prep", "train"):
        _ok(kedro_run(project, "--pipelines", stage, "--params", params))
    return project, params


def _load(project: Path, monkeypatch, name: str):
    monkeypatch.chdir(project)  # the catalog's paths are relative to the project
    return project_catalog(project).load(name)


def _kill_at(project: Path, stage: str, params: str, point: str) -> str:
    """Run ``stage`` until ``point``, SIGKILL it there; where it stopped."""
    with StoppedRun(project, kedro_command("--pipelines", stage, "--params", params),
                    stop_at=point) as run:
        run.kill()
    return run.point


def _killed_runs_are_marked(project: Path, stage: str, killed: int) -> None:
    """The next run of the project marked the killed runs KILLED, with why."""
    _, runs = mlflow_runs(project)
    statuses = [r.info.status for r in runs if r.info.run_name == stage]
    assert statuses.count("KILLED") == killed and "RUNNING" not in statuses
    for run in runs:
        if run.info.status == "KILLED":
            assert "ended without closing this run (killed" in run.data.tags["error"]


def test_data_prep_killed_mid_save_leaves_every_version_loadable(trained, monkeypatch) -> None:
    project, params = trained
    before = {name: _load(project, monkeypatch, name) for name in ("train_prompts",
                                                                    "val_prompts")}
    points = {  # where the run dies, and what it leaves
        "open-write:*/.train_prompts.parquet.*.partial": "data/05_model_input/*/*/",  # a new,
        # empty version folder
        "rename:*/val_prompts.parquet/*/val_prompts.parquet":  # train saved, val written but
            "data/05_model_input/val_prompts.parquet/*/.val_prompts.parquet.*.partial"}  # hidden
    for point, debris in points.items():
        left = set(project.glob(debris))
        where = _kill_at(project, "data_prep", params, point)
        assert set(project.glob(debris)) - left, where
        for name, frame in before.items():  # each loads whole: the earlier or the new one
            pd.testing.assert_frame_equal(_load(project, monkeypatch, name), frame)
        assert ".partial" not in _load(project, monkeypatch, "train_prompts_file")
    _ok(kedro_run(project, "--pipelines", "data_prep", "--params", params))
    for name, frame in before.items():
        pd.testing.assert_frame_equal(_load(project, monkeypatch, name), frame)
    _killed_runs_are_marked(project, "data_prep", killed=2)
    assert not list(project.glob("data/**/.*.partial"))  # the re-run cleared the leftovers


def test_merge_killed_mid_save_never_leaves_a_model_that_loads(trained, monkeypatch) -> None:
    project, params = trained
    # Killed while writing the merged model in its hidden work folder.
    where = _kill_at(project, "merge", params, "open-write:*/.merge-*/*")
    assert _load(project, monkeypatch, "merged_model") is None  # nothing half-made loads
    written = Path(where.split(" ", 2)[2])  # "<pid> <event> <path>"
    (work_dir,) = [p for p in written.parents if p.name.startswith(".merge-")]
    assert work_dir.is_dir() and work_dir.parent == project / "data/06_models"  # model_work_dir
    # Killed with the model complete, just before it is renamed into its version folder.
    _kill_at(project, "merge", params, "rename:*/merged_model/*/merged_model")
    assert _load(project, monkeypatch, "merged_model") is None
    assert not work_dir.exists()  # the second run cleared what the first left
    staged = list(project.glob("data/06_models/merged_model/*/.merged_model.*.partial"))
    assert staged
    _ok(kedro_run(project, "--pipelines", "merge", "--params", params))
    assert not any(p.exists() for p in staged)
    merged = Path(_load(project, monkeypatch, "merged_model"))
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(merged).num_parameters() > 0
    assert json.loads((merged / "merge_metadata.json").read_text())["training_run"]["steps"] == 1
    _killed_runs_are_marked(project, "merge", killed=2)


def test_eval_killed_mid_save_then_rerun_reports_whole_results(trained, monkeypatch) -> None:
    project, params = trained
    points = ["open-write:*/.eval_generations.parquet.*.partial",
              "rename:*/08_reporting/eval_metrics.json"]  # generations saved, metrics not
    for point in points:
        _kill_at(project, "eval", params, point)
        with pytest.raises(DatasetError):  # no metrics file, not a truncated one
            _load(project, monkeypatch, "eval_metrics")
    _ok(kedro_run(project, "--pipelines", "eval", "--params", params))
    metrics = _load(project, monkeypatch, "eval_metrics")
    generations = _load(project, monkeypatch, "eval_generations")
    assert metrics["base"]["prompts"] == 2
    assert len(generations) == sum(m["prompts"] for m in metrics.values())
    _killed_runs_are_marked(project, "eval", killed=2)


def test_two_data_prep_runs_at_once_write_two_intact_versions(tmp_path, tiny_model_dir,
                                                             monkeypatch) -> None:
    project = make_project(tmp_path)
    params = f"base_model={tiny_model_dir}"
    # The first run stops with its prompts written but not yet in place; the second runs
    # from start to end meanwhile; then the first goes on. GSM8K (conf/base): files of
    # thousands of rows, not conf/cpu's 600 additions.
    with StoppedRun(project, kedro_command("--pipelines", "data_prep", "--params", params,
                                           env=None),
                    stop_at="rename:*/train_prompts.parquet/*/train_prompts.parquet") as first:
        _ok(kedro_run(project, "--pipelines", "data_prep", "--params", params, env=None))
        _ok(first.resume())

    _, runs = mlflow_runs(project)
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    for name in ("train_prompts", "val_prompts"):
        versions = sorted(r.data.tags[f"dataset.saved.{name}"] for r in runs)
        assert len(set(versions)) == 2
        frames = [project_catalog(project, env="local").load(name, version=v) for v in versions
                  if monkeypatch.chdir(project) is None]
        pd.testing.assert_frame_equal(frames[0], frames[1])  # same input, same prompts
        assert len(frames[0]) > 1000


def test_full_disk_and_read_only_folder_fail_clearly_and_keep_earlier_versions(
        tmp_path, tiny_model_dir, monkeypatch) -> None:
    project = make_project(tmp_path)
    params = f"base_model={tiny_model_dir}"
    with tmpfs(project / "data/05_model_input", "16m") as folder:
        _ok(kedro_run(project, "--pipelines", "data_prep", "--params", params))
        before = _load(project, monkeypatch, "train_prompts")
        fill(folder)
        full = kedro_run(project, "--pipelines", "data_prep", "--params", params)
        remount_read_only(folder)
        read_only = kedro_run(project, "--pipelines", "data_prep", "--params", params)
        for result, problem in ((full, "the disk is full"),
                                (read_only, "the file system is read-only")):
            assert result.returncode != 0
            output = " ".join((result.stdout + result.stderr).split())
            assert f"train_prompts.parquet: {problem}" in output
            assert "earlier versions are intact" in output
        pd.testing.assert_frame_equal(_load(project, monkeypatch, "train_prompts"), before)
        assert len(list((folder / "train_prompts.parquet").iterdir())) == 1
    _, runs = mlflow_runs(project)
    assert [r.info.status for r in runs] == ["FINISHED", "FAILED", "FAILED"]
    assert "the disk is full" in runs[1].data.tags["error"]
    assert "read-only" in runs[2].data.tags["error"]


def test_a_kill_at_the_card_write_publishes_nothing_and_eval_and_promote_then_succeed(
        trained, monkeypatch) -> None:
    """The card is written once, in merge's unpublished work folder: a kill there leaves no
    published model with a stray file that check_manifest would refuse forever."""
    from rl_pipeline.model_card import check_manifest

    project, params = trained
    before = _load(project, monkeypatch, "merged_model")
    where = _kill_at(project, "merge", params, "open-write:*/.merge-*/README.md")
    assert "/.merge-" in where
    assert _load(project, monkeypatch, "merged_model") == before  # nothing new published
    _ok(kedro_run(project, "--pipelines", "merge", "--params", params))
    merged = Path(_load(project, monkeypatch, "merged_model"))
    card = (merged / "README.md").read_bytes()
    for stage in ("eval", "promote"):
        _ok(kedro_run(project, "--pipelines", stage, "--params", params))
    check_manifest(merged)
    assert (merged / "README.md").read_bytes() == card  # eval and promote wrote nothing
    assert not [p for p in project.glob("data/06_models/merged_model/*/merged_model/.*")]


def test_sigterm_ends_the_stage_as_failed_and_leaves_nothing_half_written(
        trained, monkeypatch) -> None:
    """systemd stopping the unit (SIGTERM) ended the process at once: its MLflow run stayed
    RUNNING (KILLED by the next run here, "SIGKILL, out of memory"; on another host for
    ever) and its save in progress waited for a later sweep."""
    import os
    import signal

    project, params = trained
    before = _load(project, monkeypatch, "train_prompts")
    with StoppedRun(project, kedro_command("--pipelines", "data_prep", "--params", params),
                    stop_at="open-write:*/.train_prompts.parquet.*.partial") as run:
        os.kill(run.process.pid, signal.SIGTERM)
        ended = run.resume()
    assert ended.returncode == 128 + signal.SIGTERM, ended.stdout[-3000:]
    assert "rl_pipeline: stopped by SIGTERM; the stage's MLflow run is marked FAILED" \
        in ended.stdout
    _, runs = mlflow_runs(project)
    last = [r for r in runs if r.info.run_name == "data_prep"][-1]
    assert last.info.status == "FAILED"
    assert "stopped by SIGTERM" in last.data.tags["error"]
    assert not list(project.glob("data/**/.*.partial"))  # the save cleaned up after itself
    pd.testing.assert_frame_equal(_load(project, monkeypatch, "train_prompts"), before)
