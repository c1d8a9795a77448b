"""What an earlier stage writes for the stage about to run, checked before it starts.

A stage run alone (`kedro run --pipelines promote`, an Airflow task, a cron line) reads what
earlier stages saved. When nothing is there yet, the node that loads it fails with Kedro's
"Failed while loading data from dataset MlflowJSONDataset(filepath=...)" and an errno; this
check names the input and the stage that writes it instead, before a lock, an MLflow run or
any work. Inputs a stage may go without (an optional path entry, such as eval's merged
model) are left to the stage.

The training and validation prompts are checked as a pair: data_prep's node saves them one
after the other, each atomically, so a data_prep that failed (or was killed) between the two
saves leaves its new training prompts beside an earlier run's validation prompts.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_pipeline.errors import UserError
from rl_pipeline.pipeline_registry import STAGES


class StageInputError(UserError, FileNotFoundError):
    """A stage's input that an earlier stage writes is not there yet."""


class MismatchedInputsError(UserError, ValueError):
    """Inputs that one node writes together come from different runs of it."""


# Saved by one node in one session (so under one version), read as a pair downstream.
SAVED_TOGETHER = ("train_prompts", "val_prompts")


def stage_outputs() -> dict[str, str]:
    """Each dataset a stage writes, with that stage.

    Builds every stage's pipeline from its module: `kedro run --pipelines X` registers only
    X, and this runs only when an input is missing, so a run that has its inputs never pays
    for importing the other stages.
    """
    written: dict[str, str] = {}
    for stage in STAGES:
        module = importlib.import_module(f"rl_pipeline.pipelines.{stage}")
        for name in module.create_pipeline().all_outputs():
            written.setdefault(name, stage)
    return written


def absent_inputs(pipeline: Any, catalog: Any) -> list[str]:
    """The free inputs of ``pipeline`` with nothing in ``catalog`` to load (parameters and
    optional entries aside). Datasets that cannot tell (a model source, the raw records)
    count as absent here; :func:`check_stage_inputs` keeps only what a stage writes."""
    absent = []
    for name in sorted(pipeline.inputs()):
        if name == "parameters" or name.startswith("params:"):
            continue
        if getattr(catalog.get(name), "optional", False):
            continue
        if not catalog.exists(name):
            absent.append(name)
    return absent


def check_stage_inputs(pipeline: Any, catalog: Any, env: str | None) -> None:
    """Fail when an input of ``pipeline`` that a stage writes has nothing saved yet, or when
    the inputs of :data:`SAVED_TOGETHER` (or the path entries that read their files) would
    load versions of different runs.

    Raises:
        StageInputError: Naming each such input, the stage that writes it and the command
            that runs that stage.
        MismatchedInputsError: Naming the inputs, their versions and what to do.
    """
    absent = absent_inputs(pipeline, catalog)
    written = stage_outputs() if absent else {}
    missing = [(name, written[name]) for name in absent if name in written]
    if not missing:
        _check_saved_together(pipeline, catalog, env)
        return
    env_flag = f" --env {env}" if env and env != "local" else ""
    first = min((STAGES.index(stage), stage) for _, stage in missing)[1]
    lines = [f"  - {name}: written by the {stage} stage" for name, stage in missing]
    raise StageInputError(
        "nothing saved yet for what this run reads from earlier stages:\n" + "\n".join(lines)
        + f"\nRun `kedro run{env_flag} --pipelines {first}` first, or the whole pipeline "
        f"(`kedro run{env_flag}`).")


def _check_saved_together(pipeline: Any, catalog: Any, env: str | None) -> None:
    from kedro.io.core import VersionNotFoundError

    def filepath(name: str) -> str | None:
        if name.startswith("params:") or name == "parameters" or name not in catalog:
            return None
        path = getattr(catalog.get(name), "_filepath", None)
        return None if path is None else str(path)

    together = {filepath(name) for name in SAVED_TOGETHER} - {None}
    versions: dict[str, str] = {}
    for name in sorted(pipeline.inputs()):
        dataset = catalog.get(name) if filepath(name) in together else None
        if getattr(dataset, "_version", None) is None:
            continue
        try:
            versions[name] = dataset.resolve_load_version()
        except VersionNotFoundError:
            continue  # nothing saved: absent_inputs' part, or an optional entry's
    if len(set(versions.values())) < 2:
        return
    env_flag = f" --env {env}" if env and env != "local" else ""
    listed = "\n".join(f"  - {name}: version {version}" for name, version in versions.items())
    pins = ",".join(f"{name}:<version>" for name in versions)
    raise MismatchedInputsError(
        f"these inputs come from different data_prep runs:\n{listed}\nOne data_prep saves "
        "them all; a run that failed or was killed between its saves left some of them new "
        "and some from an earlier run, and training on them would validate on prompts "
        f"prepared another way. Run `kedro run{env_flag} --pipelines data_prep` again, or "
        f"load one run's versions on purpose with --load-versions={pins}.")
