"""Leftovers of killed runs: which are removed, and which are never touched."""

from __future__ import annotations

import os
import subprocess

import pytest

from rl_pipeline.runs.debris import HOST_ID, staging_path, sweep, temporary_work_dir, work_dir


@pytest.fixture(scope="module")
def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_sweep_removes_only_what_dead_writers_of_this_host_left(tmp_path, dead_pid) -> None:
    data, scratch = tmp_path / "data", tmp_path / "tmp"
    version = data / "05_model_input/train_prompts.parquet/2026-11-21T10.00.00.000Z"
    version.mkdir(parents=True)
    scratch.mkdir()
    (version / "train_prompts.parquet").write_text("saved")
    dead = {version / f".train_prompts.parquet.{HOST_ID}-{dead_pid}-0123abcd.partial",
            data / f"06_models/resolved/.model.{HOST_ID}-{dead_pid}-89abcdef.partial/config.json",
            scratch / f".merge-{HOST_ID}-{dead_pid}-x1y2z3/model.safetensors",
            data / f"06_models/.training-result-{HOST_ID}-{dead_pid}-q/adapter_config.json"}
    kept = {staging_path(version / "val_prompts.parquet"),  # this process: a save in progress
            version / f".train_prompts.parquet.0badc0de-{dead_pid}-0123abcd.partial",  # other host
            version / ".notes.partial",  # not ours
            scratch / f".training-result-{HOST_ID}-{os.getpid()}-abc/adapter_config.json",
            data / ".merge-notes/x"}  # no owner
    for path in dead | kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    removed = sweep([data], flat=[scratch])
    # A dead writer's folder goes whole; the walk does not descend into it.
    assert {p.name for p in removed} == {
        f".train_prompts.parquet.{HOST_ID}-{dead_pid}-0123abcd.partial",
        f".model.{HOST_ID}-{dead_pid}-89abcdef.partial", f".merge-{HOST_ID}-{dead_pid}-x1y2z3",
        f".training-result-{HOST_ID}-{dead_pid}-q"}
    assert not any(p.exists() for p in dead)
    assert all(p.exists() for p in kept)
    assert (version / "train_prompts.parquet").read_text() == "saved"


def test_a_version_folder_that_held_only_a_killed_save_goes_too(tmp_path, dead_pid) -> None:
    dataset = tmp_path / "05_model_input/train_prompts.parquet"
    killed = dataset / "2026-11-21T10.00.00.000Z"
    saved = dataset / "2026-11-20T09.00.00.000Z"
    for version in (killed, saved):
        version.mkdir(parents=True)
        (version / f".train_prompts.parquet.{HOST_ID}-{dead_pid}-0123abcd.partial").write_text("x")
    (saved / "train_prompts.parquet").write_text("saved")
    sweep([tmp_path])
    assert not killed.exists()
    assert [p.name for p in saved.iterdir()] == ["train_prompts.parquet"]


def test_work_folders_carry_their_owner_and_temporary_ones_go(tmp_path) -> None:
    folder = work_dir("merge", tmp_path)
    assert folder.name.startswith(f".merge-{HOST_ID}-{os.getpid()}-")
    # Published as it is (a merged model): as readable as the folder it is in, not 0700.
    tmp_path.chmod(0o750)
    assert work_dir("merge", tmp_path).stat().st_mode & 0o777 == 0o750
    with temporary_work_dir("convert", tmp_path) as scratch:
        (scratch / "f").write_text("x")
    assert not scratch.exists()
    assert sweep([], flat=[tmp_path]) == []  # its writer (this test) is alive
    with pytest.raises(ValueError, match="work folder prefix 'scratch'"):
        work_dir("scratch", tmp_path)
