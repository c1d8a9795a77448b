"""Project hooks."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import mlflow
from kedro.framework.context import KedroContext
from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, DatasetError

from rl_pipeline.config import PARAMETER_GROUPS, ConfigError, parse_params
from rl_pipeline.engines import train_params  # noqa: F401  (registers the train group)


class ParameterValidationHook:
    """Validate every parameter group before any node runs, reporting all problems together.

    Nodes validate their own groups as well (so they stay usable outside a session); this
    hook makes a typo in, say, the train group fail a full run at once, not after data_prep.
    """

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        params = context.params
        problems = []
        for group, model in PARAMETER_GROUPS.items():
            if group not in params:
                continue
            try:
                parse_params(model, params[group], group)
            except ConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ConfigError("\n".join(problems))


# Set by `kedro run` for all the stages it runs (src/rl_pipeline/cli.py), or by a scheduler.
EXECUTION_ID_ENV = "RL_PIPELINE_EXECUTION_ID"
# EX_TEMPFAIL (sysexits.h): "try again later", what a scheduled run refused by a lock exits with.
LOCKED_EXIT_CODE = 75
_TAG_LIMIT = 5000  # MLflow keeps tag values up to 8000 characters


class StageLockedError(RuntimeError):
    """Another run of the same stage in the same project holds its lock."""


class StageLockHook:
    """One run of a stage per project at a time (a scheduled run may overlap a slow one).

    The locks are ``flock`` locks on ``data/.locks/<stage>.lock``, so a run that dies, even
    by SIGKILL, releases them with its process; no stale lock needs clearing by hand.
    """

    def __init__(self) -> None:
        self._held: list[int] = []

    @hook_impl(tryfirst=True)  # before kedro-mlflow starts a run: a refused run leaves none
    def before_pipeline_run(self, run_params: dict[str, Any]) -> None:
        from rl_pipeline.pipeline_registry import STAGES

        names = run_params.get("pipeline_names") or ["__default__"]
        stages = [s for s in STAGES if s in names or "__default__" in names]
        folder = Path(run_params["project_path"]) / "data" / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        for stage in stages:
            path = folder / f"{stage}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                os.close(fd)
                self._release()
                raise StageLockedError(
                    f"stage {stage} is already running in this project ({holder or 'unknown'}); "
                    f"this run stops without doing anything. Lock: {path}") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
                      .encode(), 0)
            self._held.append(fd)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._release()

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._release()

    def _release(self) -> None:
        while self._held:
            os.close(self._held.pop())  # closing the descriptor drops the flock


class LineageHook:
    """Tag each stage's MLflow run with what a reviewer needs to trace and reproduce it.

    kedro-mlflow already tags the Kedro run id (``run_id``), env, pipeline and command. This
    adds the pipeline execution (the stages of one `kedro run` are separate MLflow runs and
    share ``pipeline_execution_id``), the git commit and whether the tree was dirty, every
    versioned dataset's loaded and saved version, and the error of a run that fails.
    """

    def __init__(self) -> None:
        self._catalog = None
        self._save_version: str | None = None

    @hook_impl
    def after_catalog_created(self, catalog: Any, save_version: str) -> None:
        self._catalog, self._save_version = catalog, save_version

    @hook_impl(trylast=True)  # after kedro-mlflow has started the run
    def before_pipeline_run(self, run_params: dict[str, Any]) -> None:
        if mlflow.active_run() is None:  # tracking disabled for this pipeline
            return
        mlflow.set_tags({"pipeline_execution_id": os.environ.get(EXECUTION_ID_ENV)
                         or uuid.uuid4().hex, **git_state(Path(run_params["project_path"]))})

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str) -> None:
        self._tag_version("loaded", dataset_name, "resolve_load_version")

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        self._tag_version("saved", dataset_name, "resolve_save_version")

    @hook_impl
    def after_node_run(self, outputs: dict[str, Any]) -> None:
        if mlflow.active_run() is None:
            return
        report = outputs.get("preflight_report")
        if isinstance(report, dict):  # the train stage: the engine and its resolved hardware
            mlflow.set_tags({"train.engine": report.get("engine", "unknown"),
                             **{f"train.hardware.{k}": v
                                for k, v in (report.get("hardware") or {}).items()},
                             **({"train.device": report["device"]} if "device" in report
                                else {})})
        metadata = outputs.get("merge_metadata")
        if isinstance(metadata, dict):  # the merge stage: the train run and its prompt data
            self._tag_sources((metadata.get("training_run") or {}).get("mlflow_run_id"))

    @hook_impl(tryfirst=True)  # before kedro-mlflow ends the run as FAILED
    def on_pipeline_error(self, error: Exception) -> None:
        if mlflow.active_run() is not None:
            mlflow.set_tag("error", f"{type(error).__name__}: {error}"[:_TAG_LIMIT])

    @staticmethod
    def _tag_sources(train_run_id: str | None) -> None:
        if not train_run_id:
            mlflow.set_tag("source.train_run_id", "unknown")
            return
        tags = {"source.train_run_id": train_run_id}
        try:
            train_tags = mlflow.MlflowClient().get_run(train_run_id).data.tags
        except mlflow.exceptions.MlflowException:  # another tracking store
            train_tags = {}
        prefix = "dataset.loaded."
        tags.update({f"source.{k.removeprefix(prefix)}_version": v for k, v in train_tags.items()
                     if k.startswith(prefix) and "prompts" in k})
        mlflow.set_tags(tags)

    def _tag_version(self, action: str, name: str, resolve: str) -> None:
        if mlflow.active_run() is None or self._catalog is None:
            return
        dataset = self._catalog.get(name)
        if isinstance(dataset, AbstractVersionedDataset):
            try:
                version = getattr(dataset, resolve)()
            except DatasetError:  # an optional input with no version yet (merged_model)
                version = "none"
            mlflow.set_tag(f"dataset.{action}.{name}", version)


def git_state(path: Path) -> dict[str, str]:
    """The project's git commit and whether tracked files differ from it ("unknown" outside
    a git checkout, e.g. a packaged project)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit,
            "git_dirty": "unknown" if status is None else str(bool(status)).lower()}
