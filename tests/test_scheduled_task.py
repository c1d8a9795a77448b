"""The body of the Airflow DAGs' tasks (rl_pipeline.runs.scheduled_task), without Airflow.

tests/test_airflow.py checks the template's wiring in Airflow's environment; here the task's
code runs in the project's. A stage runs in a child process, as in an Airflow task's own: it
sets process-wide state for good (environment variables, Kedro's project settings, MLflow's
tracking URI) that would leak into the tests after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_pipeline.runs.scheduled_task import TaskFailed, runtime_params
from rl_pipeline.runs.stage_lock import StageLocks
from tests.projects import make_project

CHILD = """
import json, sys
from rl_pipeline.runs.scheduled_task import run_stage

outcomes = []
for conf in json.loads(sys.argv[2]):  # one interpreter for several tasks: imports once
    try:
        run_stage("data_prep", [], env="cpu", package_name="rl_pipeline", conf_source=None,
                  run_conf=conf, execution_id="rl-pipeline-cpu/test-run")
    except Exception as exc:
        outcomes.append([f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc)])
    else:
        outcomes.append([None, ""])
with open(sys.argv[1], "w") as f:
    json.dump(outcomes, f)
"""


def test_runtime_params_nest_dotted_names_and_keep_json_types() -> None:
    conf = {"params": {"train.trl.max_steps": 10, "train.trl.learning_rate": 1e-5,
                       "eval.max_prompts": 4, "data_prep.system_prompt": None,
                       "train.trl.bf16": False, "dataset_train_split": "a.jsonl",
                       "reward.judge": {"rubric": "exact"}}}
    assert runtime_params(conf) == {
        "train": {"trl": {"max_steps": 10, "learning_rate": 1e-5, "bf16": False}},
        "eval": {"max_prompts": 4}, "data_prep": {"system_prompt": None},
        "dataset_train_split": "a.jsonl", "reward": {"judge": {"rubric": "exact"}}}
    assert runtime_params({}) is None
    assert runtime_params({"params": None}) is None


@pytest.mark.parametrize(("conf", "message"), [
    ({"params": [1]}, "the DAG run's conf 'params' is [1]: expected a mapping of parameter "
                      'names to values, e.g. {"params": {"train.trl.max_steps": 10}}'),
    ({"params": {"eval..x": 1}}, "the DAG run's conf 'params' names 'eval..x': expected a "
                                 "parameter name, dotted as on the command line"),
    ({"params": {".eval": 1}}, "the DAG run's conf 'params' names '.eval'"),
])
def test_runtime_params_refuse_what_is_no_parameter(conf: dict, message: str) -> None:
    with pytest.raises(TaskFailed) as failed:
        runtime_params(conf)
    assert str(failed.value).startswith(message)


def _run_data_prep(project: Path, confs: list[dict]) -> list[tuple[str | None, str]]:
    """run_stage of data_prep (conf/cpu) in ``project`` for each DAG-run conf, in one child
    process: the class of the exception each raised, and its message."""
    out = project / "outcome.json"
    done = subprocess.run([sys.executable, "-c", CHILD, str(out), json.dumps(confs)],
                          cwd=project, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "true"})
    assert done.returncode == 0 and out.exists(), (done.stdout + done.stderr)[-3000:]
    return [tuple(outcome) for outcome in json.loads(out.read_text())]


@pytest.mark.slow  # Kedro sessions in a fresh process, imports included
def test_a_user_error_fails_the_task_and_a_running_stage_stops_it(tmp_path) -> None:
    """The run's conf reaches Kedro as `kedro run --params` would, and the project's
    whole-configuration check refuses a bad value before any node: TaskFailed, with its
    message. A stage held by a run started by hand (which a scheduled run never waits for)
    stops the task with StageLockedError."""
    project = make_project(tmp_path)
    held = StageLocks(project / "data/.locks")
    held.acquire(["data_prep"], scheduled=False)
    try:  # not scheduled, the second would run data_prep
        (failed, message), (stopped, why) = _run_data_prep(
            project, [{"params": {"eval.max_prompts": -3}}, {}])
    finally:
        held.release()
    assert failed == "rl_pipeline.runs.scheduled_task.TaskFailed", message
    assert "eval.max_prompts=-3" in message
    assert stopped == "rl_pipeline.runs.stage_lock.StageLockedError", why
    assert why.startswith(f"stage data_prep is already running in this project (pid "
                          f"{os.getpid()}, started by hand"), why
