"""Project CLI: `kedro run` that gives each stage its own session, hence its own MLflow run.

kedro-mlflow opens one MLflow run per KedroSession. A `kedro run` that spans several stages
(the default pipeline, or `--pipelines data_prep,eval`) would put every stage's parameters,
metrics and reports into one run, so a reviewer could not compare, say, two train runs
without their data_prep and eval numbers mixed in. This command runs such a request as one
session per stage, in pipeline order, each with the options given; all of them carry the same
pipeline execution id (``RL_PIPELINE_EXECUTION_ID``), which :class:`LineageHook` tags. A stage
that fails stops the run there, as Kedro would.

Anything else (one stage, a non-stage pipeline such as preflight, or node filters such as
``--from-nodes`` or ``--tags``, which may cut across stages) goes to Kedro's own command
unchanged. Kedro lets a project's ``cli.py`` override a built-in command this way.

A scheduled run refused because the same stage is already running in this project
(:mod:`rl_pipeline.stage_lock`) exits with status 75 (EX_TEMPFAIL), so a scheduler can tell
it from a failure.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import click
import mlflow
from kedro.framework.cli.project import run as kedro_run

from rl_pipeline.hooks import EXECUTION_ID_ENV
from rl_pipeline.pipeline_registry import STAGES
from rl_pipeline.stage_lock import LOCKED_EXIT_CODE, StageLockedError

logger = logging.getLogger(__name__)
# Options that select nodes: with any of them the request is not a list of whole stages.
_NODE_FILTERS = ("tags", "node_names", "from_nodes", "to_nodes", "from_inputs", "to_outputs",
                 "namespaces")


@click.group(name="rl_pipeline")
def cli() -> None:
    """rl_pipeline's project commands."""


def stages_to_run(pipeline: str | None, pipelines: list[str] | tuple[str, ...],
                  options: dict[str, Any]) -> list[str] | None:
    """The stages, in pipeline order, that a `kedro run` request covers, or None when it is
    not two or more whole stages (then Kedro runs it as one session)."""
    names = [pipeline] if pipeline else list(pipelines) or ["__default__"]
    expanded = {stage for name in names
                for stage in (STAGES if name == "__default__" else (name,))}
    if len(expanded) < 2 or not expanded <= set(STAGES):
        return None
    if any(options.get(name) for name in _NODE_FILTERS):
        return None
    return [stage for stage in STAGES if stage in expanded]


def _run(**options: Any) -> dict[str, Any]:
    try:
        return _run_stages(**options)
    except StageLockedError as exc:
        click.secho(f"rl_pipeline: {exc}", fg="yellow", err=True)
        raise SystemExit(LOCKED_EXIT_CODE) from None


def _run_stages(**options: Any) -> dict[str, Any]:
    stages = stages_to_run(options["pipeline"], options["pipelines"], options)
    if stages is None:
        return kedro_run.callback(**options)
    os.environ.setdefault(EXECUTION_ID_ENV, uuid.uuid4().hex)
    result: dict[str, Any] = {}
    for number, stage in enumerate(stages, start=1):
        click.secho(f"rl_pipeline: stage {stage} ({number}/{len(stages)}), "
                    f"pipeline execution {os.environ[EXECUTION_ID_ENV]}", fg="cyan")
        result = kedro_run.callback(**{**options, "pipeline": None, "pipelines": [stage]})
        if mlflow.active_run() is not None:
            # A run left open here would swallow the next stage's logging; never expected
            # with mlflow.yml's `nested: False`, so say so rather than hide it.
            logger.warning("MLflow run %s was still active after stage %s; ending it",
                           mlflow.active_run().info.run_id, stage)
            while mlflow.active_run() is not None:
                mlflow.end_run()
    return result


run = click.Command(name="run", params=kedro_run.params, callback=_run,
                    help=f"{kedro_run.help}\n\nSeveral whole stages (the default pipeline "
                    f"runs {', '.join(STAGES)}) run one session, and one MLflow run, each.",
                    short_help=kedro_run.short_help)
cli.add_command(run)
