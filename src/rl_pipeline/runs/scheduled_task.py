"""One stage run by a scheduler's task: the body of every task of the Airflow DAGs.

templates/airflow_dag.j2 only wires this in: it checks that the task runs in the project
folder, imports this module inside the task (the DAG processor parses the DAG files often,
with Airflow alone), and turns the two outcomes that are not a retry's to cure into Airflow's
own: :class:`TaskFailed` into ``AirflowFailException`` (failed at once, unretried) and
:class:`~rl_pipeline.runs.stage_lock.StageLockedError` into ``AirflowSkipException``. Any
other exception is left to Airflow's retries. This module imports no Airflow, so that it is
tested in the project's own environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kedro.framework.project import configure_project
from kedro.framework.session import KedroSession
from omegaconf import OmegaConf

from rl_pipeline.errors import user_error
from rl_pipeline.hooks import EXECUTION_ID_ENV
from rl_pipeline.runs.stage_lock import SCHEDULED_ENV, StageLockedError


class TaskFailed(Exception):
    """A retry would fail the same way (a bad parameter or record): the message says what to
    change."""


def runtime_params(conf: Mapping[str, Any]) -> dict[str, Any] | None:
    """What `kedro run --params` gives, for one DAG run: its conf's ``params``, a mapping of
    parameter names (dotted, as on the command line) to values, e.g. "Trigger DAG w/ config"
    with ``{"params": {"train.trl.max_steps": 10}}``, or `airflow dags test -c '...'`. Every
    task of the run gets the same parameters. Values keep their JSON types (Kedro's command
    line reads each as YAML; a JSON conf has no such ambiguity).

    Raises:
        TaskFailed: ``params`` is not a mapping, or names a parameter with an empty part.
    """
    given = conf.get("params") or {}
    if not isinstance(given, Mapping):
        raise TaskFailed(
            f"the DAG run's conf 'params' is {given!r}: expected a mapping of parameter names to "
            'values, e.g. {"params": {"train.trl.max_steps": 10}}')
    params = OmegaConf.create()
    for name, value in given.items():
        # OmegaConf takes any string as a path ("a..b" makes a key ""): refuse empty parts.
        if not all(str(name).split(".")):
            raise TaskFailed(
                f"the DAG run's conf 'params' names {name!r}: expected a parameter name, "
                "dotted as on the command line (train.trl.max_steps)")
        OmegaConf.update(params, str(name), value, merge=True)
    return OmegaConf.to_container(params) or None


def run_stage(stage: str, node_names: list[str], *, env: str, package_name: str,
              conf_source: str | None, run_conf: Mapping[str, Any], execution_id: str) -> None:
    """Run ``node_names`` of ``stage`` in one Kedro session, as a scheduled run, in the project
    at the working directory (kedro-airflow's convention: the catalog's paths are relative).

    ``run_conf`` is the DAG run's conf (see :func:`runtime_params`); ``execution_id`` is
    shared by the tasks of one DAG run, which MLflow tags as ``pipeline_execution_id``.

    Raises:
        TaskFailed: a user error (a bad parameter or record, a stage's input not saved yet).
        StageLockedError: the stage is already running in the project: skip, don't fail.
    """
    params = runtime_params(run_conf)
    # The stage lock refuses to wait for another run of the stage only in a scheduled run.
    os.environ[SCHEDULED_ENV] = "1"
    os.environ[EXECUTION_ID_ENV] = execution_id
    configure_project(package_name)
    try:
        with KedroSession.create(project_path=Path.cwd(), env=env, conf_source=conf_source,
                                 runtime_params=params) as session:
            session.run(pipeline_names=[stage], node_names=node_names)
    except StageLockedError:
        raise  # a user error too, but one that a later run will not meet
    except Exception as exc:
        if user_error(exc) is not None:
            raise TaskFailed(str(exc)) from exc
        raise
