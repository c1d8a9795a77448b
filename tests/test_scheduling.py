"""Scheduled runs: the wrapper for cron and systemd, and the lock per stage."""

from __future__ import annotations

import fcntl
import os
import re
import sys
from pathlib import Path

import mlflow
import pytest

from tests.projects import (
    StoppedRun,
    kedro_command,
    kedro_run,
    make_project,
    mlflow_runs,
    run_command,
    scheduled_command,
)

pytestmark = pytest.mark.slow


def test_a_scheduled_run_of_a_stage_already_running_exits_at_once(tmp_path,
                                                                  tiny_model_dir) -> None:
    project = make_project(tmp_path)
    # The locks' folder moved by an environment's globals.yml (one key; the others stay).
    (project / "conf/cpu/globals.yml").write_text("folders:\n  locks: data/stage-locks\n")
    model = f"base_model={tiny_model_dir}"
    assert kedro_run(project, "--pipelines", "data_prep", "--params", model).returncode == 0
    params = ["--params", f"{model},eval.max_prompts=2,data.data_max_response_length=4"]
    # A scheduled eval, stopped while it writes its generations: it holds the eval lock.
    with StoppedRun(project, scheduled_command("eval", *params),
                    stop_at="open-write:*/.eval_generations.parquet.*.partial") as first:
        second = run_command(project, scheduled_command("eval", *params))
        assert second.returncode == 75
        message = " ".join((second.stdout + second.stderr).split())
        assert "stage eval is already running in this project (pid" in message
        assert "scheduled run stops without doing anything" in message
        assert "Running node" not in message
        # A scheduled whole pipeline stops before its first stage, not after data_prep.
        whole = run_command(project, scheduled_command("__default__", *params))
        assert whole.returncode == 75, whole.stdout[-2000:]
        assert "Running node" not in whole.stdout + whole.stderr

        # A run by hand is not refused: it warns and writes its own versions.
        by_hand = run_command(project, kedro_command("--pipelines", "eval", *params))
        assert by_hand.returncode == 0, by_hand.stderr[-3000:]
        assert "a scheduled run of stage eval is running in this project" in " ".join(
            (by_hand.stdout + by_hand.stderr).split())

        resumed = first.resume()
        assert resumed.returncode == 0, resumed.stdout[-3000:]
        assert "scheduled run of eval (kedro env cpu)" in resumed.stdout
        # Its log: one plain line per record from the first on, no progress bars. (Except
        # MLflow's advice to kedro-mlflow as it is imported, under a warnings filter of
        # MLflow's own that no filter of ours can override: its message and source line.)
        lines = [line for line in resumed.stdout.splitlines()
                 if "UserWarning: \x1b[33mAdd type hints" not in line
                 and line != "  color_warning("]
        assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line)
                   for line in lines), resumed.stdout[:3000]
        assert "\r" not in resumed.stdout  # (stderr is in stdout)
    _, runs = mlflow_runs(project)
    assert [(r.info.run_name, r.info.status) for r in runs] == [
        ("data_prep", "FINISHED"), ("eval", "FINISHED"), ("eval", "FINISHED")]
    assert not (project / "data/.locks").exists()
    # Released when the runs ended (the whole pipeline's check held none): the next one
    # would take each at once.
    for stage in ("data_prep", "train", "eval"):
        with open(project / f"data/stage-locks/{stage}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if held


def test_the_wrapper_says_how_to_use_it(tmp_path) -> None:
    project = make_project(tmp_path)
    result = run_command(project, ["bash", "scripts/scheduled_run.sh"])
    assert result.returncode == 64
    assert "usage:" in result.stderr and "STAGE" in result.stderr
    # A stage that is none: usage too, not Kedro's ImportError traceback and status 1.
    typo = run_command(project, ["bash", "scripts/scheduled_run.sh", "evall"])
    assert typo.returncode == 64 and "no stage 'evall'" in typo.stderr
    # The wrapper's list of stages is the pipeline registry's.
    from rl_pipeline.pipeline_registry import STAGES

    assert f"    {'|'.join(STAGES)}|__default__) ;;" in (
        project / "scripts/scheduled_run.sh").read_text()


def test_a_stage_run_before_the_stage_it_reads_from_starts_nothing(tmp_path) -> None:
    """promote alone in a new project: the message names what eval writes and the command,
    before the stage lock is taken or an MLflow run started (tests/test_stage_inputs.py
    checks the message for each stage)."""
    project = make_project(tmp_path)
    result = kedro_run(project, "--pipelines", "promote")
    assert result.returncode == 1
    said = " ".join((result.stdout + result.stderr).split())
    assert ("Error: nothing saved yet for what this run reads from earlier stages: - "
            "eval_registry: written by the eval stage Run `kedro run --env cpu --pipelines "
            "eval` first") in said, said[-3000:]
    assert "Traceback" not in said and "Running node" not in said
    assert not (project / "data/.locks/promote.lock").exists()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def test_a_gpu_host_whose_driver_fails_is_not_run_as_a_cpu_host(tmp_path) -> None:
    """Without $KEDRO_ENV the wrapper picks local with a GPU and cpu without one; an
    nvidia-smi that is installed and fails (a driver that did not load after an update) is
    neither: it stops, rather than train the CPU task unattended on a GPU host."""
    project = make_project(tmp_path)
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\\''t communicate "
                   "with the NVIDIA driver.'\nexit 9\n")
    smi.chmod(0o755)
    command = ["env", "-u", "KEDRO_ENV", f"PYTHON={sys.executable}", "bash",
               "scripts/scheduled_run.sh", "promote"]
    broken = run_command(project, command, PATH=f"{tools}:{os.environ['PATH']}")
    assert broken.returncode == 69, broken.stdout[-2000:] + broken.stderr[-2000:]
    assert "nvidia-smi is installed but failed: NVIDIA-SMI has failed" in broken.stderr
    assert "set KEDRO_ENV (cpu or local)" in broken.stderr
    assert "scheduled run of" not in broken.stdout
    # No nvidia-smi at all: a CPU host, the cpu configuration (promote then stops on its
    # missing inputs, as in the test above).
    plain_path = ":".join(d for d in os.environ["PATH"].split(":")
                          if not (Path(d) / "nvidia-smi").exists())
    cpu = run_command(project, command, PATH=plain_path)
    assert "scheduled run of promote (kedro env cpu)" in cpu.stdout, cpu.stderr[-2000:]
    assert "kedro run --env cpu --pipelines eval" in " ".join((cpu.stdout + cpu.stderr).split())
    # NVIDIA's tools on a machine without a GPU (a cloud image that has them): a CPU host.
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    none = run_command(project, command, PATH=f"{tools}:{plain_path}")
    assert "scheduled run of promote (kedro env cpu)" in none.stdout, none.stderr[-2000:]
