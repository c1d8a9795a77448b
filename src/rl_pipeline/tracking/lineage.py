"""What MLflow does not record about a run itself: the code it ran, the process that ran it."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import mlflow

from rl_pipeline.runs.debris import pid_alive

logger = logging.getLogger(__name__)

HOST_TAG, PID_TAG = "process.host", "process.pid"


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


def process_tags() -> dict[str, str]:
    """Where this run's process lives, so a later run can tell that it died."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def end_orphaned_runs(client: mlflow.MlflowClient, experiment_id: str, current_run_id: str
                      ) -> list[str]:
    """Mark KILLED the RUNNING runs of this host whose process no longer exists.

    A process killed by SIGKILL or the out-of-memory killer runs no hook, so its MLflow run
    would stay RUNNING for ever, which a reviewer reads as "still training". Only runs tagged
    with this host are considered; a pid that exists (perhaps reused) is left alone.

    Returns:
        The ids of the runs marked KILLED.
    """
    host = socket.gethostname()
    runs = client.search_runs(
        [experiment_id], filter_string=f"attributes.status = 'RUNNING' and "
                                       f"tags.`{HOST_TAG}` = '{host}'", max_results=1000)
    ended = []
    for run in runs:
        pid = run.data.tags.get(PID_TAG, "")
        if run.info.run_id == current_run_id or not pid.isdigit() or pid_alive(int(pid)):
            continue
        client.set_tag(run.info.run_id, "error",
                       f"process {pid} on {host} ended without closing this run (killed: "
                       f"SIGKILL, out of memory or power loss); found by run {current_run_id}")
        client.set_terminated(run.info.run_id, status="KILLED")
        ended.append(run.info.run_id)
    if ended:
        logger.warning("marked %d MLflow run(s) KILLED whose process had died: %s", len(ended),
                       ", ".join(ended))
    return ended



def active_run_id() -> str | None:
    """The active MLflow run's id; None when tracking is off."""
    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


def weights_run(training_run: dict[str, Any]) -> str | None:
    """The train run whose weights a model holds: the run that trained them, which for a
    rerun of a complete run (trained no further) is the earlier run (``weights_run_id``)."""
    return training_run.get("weights_run_id") or training_run.get("mlflow_run_id") or None


def training_sources(training_run: dict[str, Any]) -> dict[str, str]:
    """The ``source.*`` tags of a model trained by ``training_run`` (the run summary in the
    training result's record, carried into merge_metadata.json): the train run whose weights
    it holds, its identity, and the versions of the prompts it loaded."""
    train_run_id = weights_run(training_run)
    identity = {"source.train_identity": training_run.get("identity") or "unknown"}
    if not train_run_id:
        return {"source.train_run_id": "unknown", **identity}
    tags = {"source.train_run_id": train_run_id, **identity}
    try:
        train_tags = mlflow.MlflowClient().get_run(train_run_id).data.tags
    except mlflow.exceptions.MlflowException:  # another tracking store
        train_tags = {}
    prefix = "dataset.loaded."
    tags.update({f"source.{k.removeprefix(prefix)}_version": v for k, v in train_tags.items()
                 if k.startswith(prefix) and "prompts" in k})
    return tags


def prompt_facts(sources: dict[str, str], training_run: dict[str, Any]) -> dict[str, object]:
    """The training prompts' versions (from ``source.*`` tags), row count (the train run's
    ``preflight.train_prompts`` metric) and data sources (the train summary's), for a model
    card."""
    versions = {k.removeprefix("source.").removesuffix("_version"): v
                for k, v in sources.items() if k.endswith("_version")}
    rows: dict[str, int] = {}
    train_run = sources.get("source.train_run_id")
    if train_run and train_run != "unknown":
        try:
            metrics = mlflow.MlflowClient().get_run(train_run).data.metrics
        except mlflow.exceptions.MlflowException:  # another tracking store
            metrics = {}
        if "preflight.train_prompts" in metrics:  # the catalog's preflight_metrics prefix
            rows["train_prompts"] = int(metrics["preflight.train_prompts"])
    return {"versions": versions, "rows": rows,
            "data_sources": list(training_run.get("data_sources") or [])}
