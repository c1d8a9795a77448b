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
(:mod:`rl_pipeline.runs.stage_lock`) exits with status 75 (EX_TEMPFAIL), so a scheduler can tell
it from a failure.

Off a terminal (cron's log, a pipe) the run logs one plain line per record and shows no
progress bars (:mod:`rl_pipeline.plain_output`).

SIGTERM (systemd stopping a unit, ``kill``) and SIGHUP stop a run as an error does, where it
is: the stage's MLflow run ends FAILED with the signal in its ``error`` tag, a save in
progress is cleaned up, and the status is 128 + the signal's number (143 for SIGTERM). By
default they ended the process at once, its MLflow run left RUNNING for ever.

A user error (:mod:`rl_pipeline.errors`: a bad parameter, record or file) prints its message,
``Error: ...``, and exits with status 1, without the traceback; any other exception keeps
its traceback. A ``--params`` value that is not YAML (a prompt template without quotes) is
a usage error (status 2) that names the item and the quoting that works.
"""

from __future__ import annotations

import copy
import logging
import os
import shlex
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import mlflow
import yaml
from kedro.framework.cli.project import run as kedro_run
from kedro.framework.cli.utils import _split_params as kedro_split_params
from kedro.framework.cli.utils import split_string
from omegaconf import OmegaConf

from rl_pipeline.errors import (
    TRACEBACK_HINT,
    Terminated,
    show_tracebacks,
    terminated,
    user_error,
    user_message,
)
from rl_pipeline.hooks import EXECUTION_ID_ENV
from rl_pipeline.pipeline_registry import STAGES
from rl_pipeline.plain_output import plain_output_off_a_terminal
from rl_pipeline.runs.command import COMMAND_ENV
from rl_pipeline.runs.environment import environ
from rl_pipeline.runs.stage_lock import COMMAND_STAGES_ENV, LOCKED_EXIT_CODE, StageLockedError

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


class UserErrorExit(click.ClickException):
    """A user error's message, printed as click prints its own errors (``Error: ...`` on
    stderr, status 1), with how to see the traceback."""

    def show(self, file: Any = None) -> None:
        click.secho(f"Error: {self.format_message()}", err=True, fg="red")
        click.secho(TRACEBACK_HINT, err=True)


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    raise Terminated(signum)


@contextmanager
def _stops_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread while the block runs
    (Kedro's error hooks see only exceptions: a default SIGTERM ended the process with its
    MLflow run RUNNING)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _run(**options: Any) -> dict[str, Any]:
    # What the user typed, for each stage's run (LineageHook's kedro_command tag): this
    # process's own command line, never one inherited from a parent, and not left behind.
    with plain_output_off_a_terminal(), \
            environ(**{COMMAND_ENV: shlex.join(["kedro", *sys.argv[1:]])}):
        return _run_reporting(**options)


def _run_reporting(**options: Any) -> dict[str, Any]:
    try:
        with _stops_raise():
            return _run_stages(**options)
    except StageLockedError as exc:
        click.secho(f"rl_pipeline: {exc}", fg="yellow", err=True)
        raise SystemExit(LOCKED_EXIT_CODE) from None
    except Exception as exc:
        if (stop := terminated(exc)) is not None:
            click.secho(f"rl_pipeline: {stop}; the stage's MLflow run is marked FAILED",
                        fg="yellow", err=True)
            raise SystemExit(128 + stop.signum) from None
        found = user_error(exc)
        if found is None or show_tracebacks():
            raise
        raise UserErrorExit(user_message(exc, found)) from None


def _run_stages(**options: Any) -> dict[str, Any]:
    stages = stages_to_run(options["pipeline"], options["pipelines"], options)
    if stages is None:
        return kedro_run.callback(**options)
    # One id for the stages of this command; a scheduler's own id (scheduled_task) is kept.
    with environ(**{EXECUTION_ID_ENV: os.environ.get(EXECUTION_ID_ENV) or uuid.uuid4().hex,
                    COMMAND_STAGES_ENV: ",".join(stages)}):
        return _each_stage(stages, options)


def _each_stage(stages: list[str], options: dict[str, Any]) -> dict[str, Any]:
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


def _yaml_quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _as_text(flag: str, key: str, text: str) -> str:
    """``flag key="text"``, quoted for a POSIX shell: the value is YAML's double-quoted
    string, which Kedro reads back as ``text``."""
    return f"{flag} {shlex.quote(f'{key}={_yaml_quoted(text)}')}"


def _unparsed_item(flag: str, key: str, text: str, exc: yaml.YAMLError) -> str:
    """Why ``key=text`` of ``--params`` is refused, and the quoting that passes it as text."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at column {mark.column + 1}" if mark is not None else ""
    starts = {"{": ", and '{' starts a YAML mapping", "[": ", and '[' starts a YAML list"}
    return (f"{key}={text}: Kedro reads each {flag} value as YAML{starts.get(text[:1], '')}; "
            f"this one is not YAML ({problem}{where}). For the text as it is, quote the value "
            f"inside the shell's quotes: {_as_text(flag, key, text)}")


def _has_null(tree: Any) -> bool:
    if isinstance(tree, dict):
        return any(v is None or _has_null(v) for v in tree.values())
    return False


def _split_params(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Kedro's ``--params`` parsing (``key=value,key=value``, each value read as YAML), with
    the item and the quoting that works named where Kedro would fail with a bare YAML error,
    and a warning where a value becomes a mapping by accident (``Solve: {question}``)."""
    if isinstance(value, dict) or not value:
        return kedro_split_params(ctx, param, value)
    flag = param.opts[0] if getattr(param, "opts", None) else f"--{param.name}"
    items = split_string(ctx, param, value)
    if "," in value and any("=" not in item for item in items):
        raise click.BadParameter(
            f"{value}: {flag} splits its value at every comma, quoted or not, and "
            f"{next(i for i in items if '=' not in i)!r} has no key=. A value with a comma "
            f"goes in a parameters file (conf/local/parameters.yml).", ctx=ctx, param=param)
    for item in items:
        key, _, text = item.partition("=")
        key = key.strip()
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"{key}={text}"]))
        except yaml.YAMLError as exc:
            raise click.BadParameter(_unparsed_item(flag, key, text, exc), ctx=ctx,
                                     param=param) from None
        except Exception:  # Kedro's own parsing, below, reports it
            continue
        leaf = _leaf(parsed, key)
        if "{" in text and _has_null(leaf):
            click.secho(f"Warning: {flag} {item}: Kedro reads the value as YAML, which makes "
                        f"it the mapping {leaf!r}. For the text, quote it: "
                        f"{_as_text(flag, key, text)}", err=True, fg="yellow")
    return kedro_split_params(ctx, param, value)


def _leaf(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _with_params_parsing(params: list[click.Parameter]) -> list[click.Parameter]:
    """Kedro's `kedro run` options, the ones parsed by Kedro's ``_split_params`` parsed by
    :func:`_split_params` instead."""
    out = []
    for param in params:
        if param.callback is kedro_split_params:
            param = copy.copy(param)
            param.callback = _split_params
        out.append(param)
    return out


run = click.Command(name="run", params=_with_params_parsing(kedro_run.params), callback=_run,
                    help=f"{kedro_run.help}\n\nSeveral whole stages (the default pipeline "
                    f"runs {', '.join(STAGES)}) run one session, and one MLflow run, each.",
                    short_help=kedro_run.short_help)
cli.add_command(run)


# The stages that write or read the model folders: held while versions are removed.
_MODEL_STAGES = ("train", "merge", "eval", "promote")


@cli.command()
@click.option("--env", "-e", default=None,
              help="Kedro environment whose catalog and registry to prune (as kedro run's).")
@click.option("--keep", default=3, show_default=True, type=click.IntRange(min=1),
              help="Newest versions of each model folder dataset that stay.")
@click.option("--apply", "apply_", is_flag=True,
              help="Remove them; without it, list what would go and remove nothing.")
def prune(env: str | None, keep: int, apply_: bool) -> None:
    """Remove old versions of the model folders (merged models, training results).

    Each stays when it is one of the newest --keep of its dataset or a registry alias
    (champion, candidate) points at it; the registry version of a merged model removed is
    tagged so. Lists what would go unless --apply. While it removes, it holds the locks of
    the stages that use the folders: a scheduled run of one stops (status 75), as a prune
    does when one is running.
    """
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from rl_pipeline.hooks import project_folders
    from rl_pipeline.runs.stage_lock import StageLocks

    project = Path.cwd()
    bootstrap_project(project)
    with KedroSession.create(project_path=project, env=env) as session:
        context = session.load_context()  # kedro-mlflow points MLflow at the project's store
        locks = StageLocks(project_folders(context)["locks"])
        if apply_:
            try:
                locks.acquire(_MODEL_STAGES, scheduled=True)
            except StageLockedError as exc:
                click.secho(f"rl_pipeline: prune removes nothing while a run uses the model "
                            f"folders: {exc}", fg="yellow", err=True)
                raise SystemExit(LOCKED_EXIT_CODE) from None
        try:
            _prune(context, project, keep, apply_)
        finally:
            locks.release()


def _prune(context: Any, project: Path, keep: int, apply_: bool) -> None:
    from rl_pipeline import model_registry
    from rl_pipeline.runs.retention import human_size, plan, remove_versions

    datasets = {name: project / entry["path"]
                for name, entry in context.config_loader["catalog"].items()
                if isinstance(entry, dict) and entry.get("versioned")
                and str(entry.get("type", "")).endswith("ModelFolderDataset")}
    name = context.params["registry"].model_name  # None: nothing registered
    entries = plan(datasets, keep, model_registry.alias_folders(name) if name else {})
    gone = [e for e in entries if e.kept_because is None]
    merged = [e for e in gone if e.dataset == "merged_model"]
    if name and merged and not model_registry.is_registered(name):
        # Another store than the merges registered in (no --env, MLFLOW_REGISTRY_URI unset):
        # no alias found, so the champion's folder would go with the others.
        import mlflow

        raise click.ClickException(
            f"the registry {mlflow.get_registry_uri()} has no registered model {name!r}, so "
            f"prune cannot tell which of the {len(merged)} merged model(s) it would remove "
            "a registry alias (champion, candidate) holds. Run it with the --env (or "
            "MLFLOW_REGISTRY_URI) of the registry the merges registered in; for models "
            "merged without a registry, set registry.model_name: null in that environment. "
            "Nothing was removed.")
    if apply_:
        for entry in remove_versions(gone):
            if name and entry.dataset == "merged_model":
                model_registry.mark_folder_removed(name, entry.path / datasets[entry.dataset].name)
    for entry in entries:
        click.echo(f"{entry.dataset:<18} {entry.version}  {human_size(entry.size):>10}  "
                   + (f"stays: {entry.kept_because}" if entry.kept_because
                      else "removed" if apply_ else "would be removed"))
    freed = human_size(sum(e.size for e in gone))
    click.echo(f"{len(gone)} version(s) removed, {freed} freed." if apply_ else
               f"{len(gone)} version(s), {freed}, would be removed: run again with --apply "
               "to remove them.")
