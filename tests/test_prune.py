"""`kedro prune`: old versions of the model folders go, the newest and the registry's
aliases stay, and nothing goes while a run uses the folders."""

from __future__ import annotations

import sys

import mlflow
import pytest

from rl_pipeline.model_registry import CHAMPION, PATH_TAG, STORAGE_TAG
from rl_pipeline.runs.retention import plan, remove_versions
from rl_pipeline.runs.stage_lock import StageLocks
from tests.projects import make_project, run_command

MERGED = [f"2026-11-0{day}T10.00.00.000Z" for day in (1, 2, 3)]


def _version(folder, name: str, size: int = 1000) -> None:
    """A version as the catalog saves it: <folder>/<version>/<folder's name>/."""
    (folder / name / folder.name).mkdir(parents=True)
    (folder / name / folder.name / "model.safetensors").write_bytes(b"w" * size)


def test_the_newest_and_the_protected_stay_and_the_rest_goes_whole(tmp_path) -> None:
    merged = tmp_path / "merged_model"
    for name in MERGED:
        _version(merged, name)
    (merged / "notes").mkdir()  # not a version: never touched
    saving = "2026-11-04T10.00.00.000Z"  # the newest, but nothing in it yet: not counted
    (merged / saving).mkdir()
    entries = plan({"merged_model": merged}, keep=1, protected={
        merged / MERGED[0] / "merged_model": "registry alias champion (version 1)"})
    assert [(e.version, e.kept_because) for e in entries] == [
        (MERGED[0], "registry alias champion (version 1)"), (MERGED[1], None),
        (MERGED[2], "one of the newest 1"),
        (saving, "no merged_model in it: a save in progress, or a killed one's")]
    assert entries[1].size == 1000
    removed = remove_versions(entries)
    assert [e.version for e in removed] == [MERGED[1]]
    assert sorted(p.name for p in merged.iterdir()) == [MERGED[0], MERGED[2], saving, "notes"]
    with pytest.raises(ValueError, match="keep=0: at least 1"):
        plan({"merged_model": merged}, keep=0, protected={})


@pytest.mark.slow
def test_kedro_prune_lists_then_removes_and_tags_the_registry(tmp_path) -> None:
    project = make_project(tmp_path)
    merged = project / "data/06_models/merged_model"
    result = project / "data/06_models/training_result"
    for name in MERGED:
        _version(merged, name)
    for name in MERGED[:2]:
        _version(result, name)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    client.create_registered_model("rl_pipeline")
    for name in MERGED:
        folder = f"data/06_models/merged_model/{name}/merged_model"
        client.create_model_version("rl_pipeline", (project / folder).as_uri(),
                                    tags={PATH_TAG: folder})
    client.set_registered_model_alias("rl_pipeline", CHAMPION, "1")
    prune = [sys.executable, "-m", "kedro", "prune", "--env", "cpu", "--keep", "1"]

    listed = run_command(project, prune)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert f"merged_model       {MERGED[0]}" in listed.stdout
    assert "stays: registry alias champion (rl_pipeline version 1)" in listed.stdout
    assert "2 version(s), 2.0 KiB, would be removed: run again with --apply" in listed.stdout
    assert len(list(merged.iterdir())) == 3 and len(list(result.iterdir())) == 2

    # A run of a stage that uses the folders (by hand, here eval): nothing goes.
    locks = StageLocks(project / "data/.locks")
    locks.acquire(["eval"], scheduled=False)
    try:
        refused = run_command(project, [*prune, "--apply"])
    finally:
        locks.release()
    assert refused.returncode == 75
    assert "prune removes nothing while a run uses the model folders" in refused.stderr
    assert len(list(merged.iterdir())) == 3

    applied = run_command(project, [*prune, "--apply"])
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert "2 version(s) removed, 2.0 KiB freed." in applied.stdout
    assert sorted(p.name for p in merged.iterdir()) == [MERGED[0], MERGED[2]]
    assert [p.name for p in result.iterdir()] == [MERGED[1]]
    tags = {str(v.version): v.tags.get(STORAGE_TAG, "")
            for v in client.search_model_versions("name='rl_pipeline'")}
    assert tags["2"].startswith("folder removed by kedro prune on ")
    assert not tags["1"].startswith("folder removed") and not tags["3"].startswith("folder")


@pytest.mark.slow
def test_prune_asking_a_registry_without_the_model_removes_nothing(tmp_path) -> None:
    """The merges registered in another store (a tracking server, MLFLOW_REGISTRY_URI in
    the scheduler's unit): prune asked the project's own SQLite store, found no alias, and
    removed the champion's folder with the others."""
    project = make_project(tmp_path)
    merged = project / "data/06_models/merged_model"
    for name in MERGED:
        _version(merged, name)
    server = f"sqlite:///{project}/server.db"
    client = mlflow.MlflowClient(tracking_uri=server, registry_uri=server)
    client.create_registered_model("rl_pipeline")
    folder = f"data/06_models/merged_model/{MERGED[0]}/merged_model"
    client.create_model_version("rl_pipeline", (project / folder).as_uri(),
                                tags={PATH_TAG: folder})
    client.set_registered_model_alias("rl_pipeline", CHAMPION, "1")
    prune = [sys.executable, "-m", "kedro", "prune", "--env", "cpu", "--keep", "1", "--apply"]

    refused = run_command(project, prune)
    assert refused.returncode == 1
    assert "has no registered model 'rl_pipeline', so prune cannot tell which of the 2 " \
           "merged model(s) it would remove a registry alias" in refused.stderr
    assert "Nothing was removed." in refused.stderr
    assert len(list(merged.iterdir())) == 3
    # Pointed at the registry that has it: the champion's folder stays.
    applied = run_command(project, prune, MLFLOW_REGISTRY_URI=server)
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert sorted(p.name for p in merged.iterdir()) == [MERGED[0], MERGED[2]]
