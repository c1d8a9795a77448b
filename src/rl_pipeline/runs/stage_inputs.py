"""What an earlier stage writes for the stage about to run, checked before it starts.

A stage run alone (`kedro run --pipelines promote`, an Airflow task, a cron line) reads what
earlier stages saved. When nothing is there yet, the node that loads it fails with Kedro's
"Failed while loading data from dataset MlflowJSONDataset(filepath=...)" and an errno; this
check names the input and the stage that writes it instead, before a lock, an MLflow run or
any work. Inputs a stage may go without (an optional path entry, such as eval's merged
model) are left to the stage.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_pipeline.errors import UserError
from rl_pipeline.pipeline_registry import STAGES


class StageInputError(UserError, FileNotFoundError):
    """A stage's input that an earlier stage writes is not there yet."""


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
    """Fail when an input of ``pipeline`` that a stage writes has nothing saved yet.

    Raises:
        StageInputError: Naming each such input, the stage that writes it and the command
            that runs that stage.
    """
    absent = absent_inputs(pipeline, catalog)
    if not absent:
        return
    written = stage_outputs()
    missing = [(name, written[name]) for name in absent if name in written]
    if not missing:
        return
    env_flag = f" --env {env}" if env and env != "local" else ""
    first = min((STAGES.index(stage), stage) for _, stage in missing)[1]
    lines = [f"  - {name}: written by the {stage} stage" for name, stage in missing]
    raise StageInputError(
        "nothing saved yet for what this run reads from earlier stages:\n" + "\n".join(lines)
        + f"\nRun `kedro run{env_flag} --pipelines {first}` first, or the whole pipeline "
        f"(`kedro run{env_flag}`).")
