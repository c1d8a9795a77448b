"""Airflow's own `airflow dags test` of the generated DAGs, run as on an Airflow worker.

`make airflow-test` builds the worker's environment (.venv-airflow-worker: Airflow 3.3 with
the project installed as docs/scheduling.md says, `pip install -e . -c constraints-cpu.txt`)
and runs this module; `make test` leaves it out (pyproject's addopts deselect the
``airflow_worker`` mark), since the install and a whole DAG run would take the suite past its
time. Each test runs the Airflow CLI with a SQLite metadata database in a scratch
AIRFLOW_HOME, the DAGs generated for conf/cpu in its DAG folder, and a scratch project as the
working directory. The tests run in order: the first lists the DAGs before anything parsed
them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest

from tests.conftest import PROJECT_ROOT
from tests.projects import generate_dags, make_project, mlflow_runs

pytestmark = [pytest.mark.slow, pytest.mark.airflow_worker]
WORKER = PROJECT_ROOT / ".venv-airflow-worker"
DAG_IDS = {"rl-pipeline-cpu-default", "rl-pipeline-cpu-data-prep", "rl-pipeline-cpu-train",
           "rl-pipeline-cpu-merge", "rl-pipeline-cpu-eval", "rl-pipeline-cpu-promote"}
# The whole DAG, short (tests/test_run.py's SHORT), as a DAG run's conf.
SHORT = {"train.trl.max_steps": 2, "data.data_max_response_length": 24,
         "train.trl.save_steps": 1, "eval.max_prompts": 4}


@dataclass
class Airflow:
    """The Airflow CLI of the worker environment, on one metadata database and DAG folder."""

    home: Path
    project: Path

    def __call__(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        env = {"AIRFLOW_HOME": str(self.home),
               "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "KEDRO_DISABLE_TELEMETRY": "true",
               # Airflow warns on stdout that graphviz is missing, ahead of its JSON.
               "PYTHONWARNINGS": "ignore", "HOME": os.environ.get("HOME", str(self.home)),
               "PATH": f"{WORKER / 'bin'}:/usr/bin:/bin", "COLUMNS": "200"}
        return subprocess.run([str(WORKER / "bin/airflow"), *args], cwd=cwd or self.project,
                              capture_output=True, text=True, env=env, timeout=900)

    def listing(self, *args: str) -> list[dict]:
        done = self(*args, "-o", "json")
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout[done.stdout.index("["):])

    def test_dag(self, dag_id: str, conf: dict | None = None,
                 cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
        """`airflow dags test`; its output, and the run: ``state``, ``run_id``, ``tasks``
        (task id: state)."""
        done = self("dags", "test", dag_id, *(["-c", json.dumps(conf)] if conf else []),
                    cwd=cwd)
        run = self.listing("dags", "list-runs", dag_id)[0]  # the newest first
        tasks = self.listing("tasks", "states-for-dag-run", dag_id, run["run_id"])
        return done, {**run, "tasks": {t["task_id"]: t["state"] for t in tasks}}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory) -> Airflow:
    if not (WORKER / "bin/airflow").exists():
        pytest.skip("no Airflow worker environment: `make airflow-test` makes "
                    ".venv-airflow-worker")
    root = tmp_path_factory.mktemp("airflow")
    project = make_project(root)
    # A project has git history, as the lineage tags expect.
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    found = generate_dags(project, root / "home/dags", env="cpu")
    assert len(found) == 6
    airflow = Airflow(root / "home", project)
    migrated = airflow("db", "migrate")
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return airflow


def said(done: subprocess.CompletedProcess) -> str:
    return " ".join((done.stdout + done.stderr).split())


def test_dags_list_shows_the_dags_once_they_are_reserialized(airflow) -> None:
    """Airflow 3 lists what its DAG processor stored in the database, not the folder
    (docs/scheduling.md): nothing until `airflow dags reserialize`."""
    assert not DAG_IDS & {d["dag_id"] for d in airflow.listing("dags", "list")}
    done = airflow("dags", "reserialize")
    assert done.returncode == 0, done.stderr[-3000:]
    assert DAG_IDS <= {d["dag_id"] for d in airflow.listing("dags", "list")}


def test_a_task_outside_the_project_folder_fails_at_once_naming_the_folder(
        airflow, tmp_path) -> None:
    """Not a misleading MLflow store error, and no retry: the task is failed, not
    up_for_retry (a retry would make `dags test` wait 10 minutes for the same failure)."""
    done, run = airflow.test_dag("rl-pipeline-cpu-data-prep", cwd=tmp_path)
    assert (run["state"], run["tasks"]) == ("failed", {"data_prep": "failed"})
    assert (f"AirflowFailException: the task runs in {tmp_path}, which is not the rl_pipeline "
            "project folder") in said(done)


def test_promote_before_eval_fails_at_once_naming_the_stage_to_run(airflow) -> None:
    done, run = airflow.test_dag("rl-pipeline-cpu-promote")
    assert (run["state"], run["tasks"]) == ("failed", {"promote": "failed"})
    assert ("AirflowFailException: nothing saved yet for what this run reads from earlier "
            "stages: - eval_registry: written by the eval stage Run `kedro run --env cpu "
            "--pipelines eval` first") in said(done)


def test_a_bad_parameter_in_the_run_conf_fails_at_once_naming_it(airflow) -> None:
    """The run's conf reaches Kedro as `kedro run --params` would, checked the same way."""
    done, run = airflow.test_dag("rl-pipeline-cpu-data-prep",
                                 conf={"params": {"eval.max_prompts": -3}})
    assert (run["state"], run["tasks"]) == ("failed", {"data_prep": "failed"})
    assert "eval.max_prompts=-3" in said(done), said(done)[-3000:]
    conf = airflow.test_dag("rl-pipeline-cpu-data-prep", conf={"params": [1]})[0]
    assert ("the DAG run's conf 'params' is [1]: expected a mapping of parameter names to "
            "values") in said(conf)
    conf = airflow.test_dag("rl-pipeline-cpu-data-prep", conf={"params": {"eval..x": 1}})[0]
    assert "the DAG run's conf 'params' names 'eval..x': expected a parameter name" in said(conf)


def test_the_whole_dag_runs_each_stage_once_and_the_gate_decides(airflow) -> None:
    """data_prep → train → merge → eval → promote, one task and one MLflow run per stage,
    sharing the DAG run's execution id; the run's conf shortens it; the merged model is
    registered, eval makes it the candidate and promote decides."""
    done, run = airflow.test_dag("rl-pipeline-cpu-default", conf={"params": SHORT})
    assert run["state"] == "success", said(done)[-5000:]
    assert run["tasks"] == dict.fromkeys(("data_prep", "train", "merge", "eval", "promote"),
                                         "success")
    client, runs = mlflow_runs(airflow.project)
    assert [(r.info.run_name, r.info.status) for r in runs] == [
        (stage, "FINISHED") for stage in ("data_prep", "train", "merge", "eval", "promote")]
    assert {r.data.tags["pipeline_execution_id"] for r in runs} == {
        f"rl-pipeline-cpu-default/{run['run_id']}"}
    train = next(r for r in runs if r.info.run_name == "train")
    assert train.data.params["train.trl.max_steps"] == "2"
    # The gate decided on version 1, which eval made the candidate.
    version = client.get_model_version_by_alias("rl_pipeline", "candidate")
    assert str(version.version) == "1"
    promote = next(r for r in runs if r.info.run_name == "promote")
    decision = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=promote.info.run_id, artifact_path="promote/promotion_decision.json",
        tracking_uri=f"sqlite:///{airflow.project}/mlflow.db")).read_text())
    assert decision["candidate"] == "1" and decision["reasons"]
    aliases = client.get_model_version("rl_pipeline", "1").aliases
    assert ("champion" in aliases) == decision["promoted"]
