"""Project pipelines: one per stage, run alone (`kedro run --pipelines data_prep`) or together."""

from __future__ import annotations

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline

# The order of the stages in a full run; `__default__` chains them.
STAGES = ("data_prep", "train", "merge", "eval", "promote")


def register_pipelines() -> dict[str, Pipeline]:
    """Register the project's pipelines.

    Returns:
        A mapping from pipeline names to ``Pipeline`` objects.
    """
    pipelines = find_pipelines(raise_errors=True)
    # Each node carries its stage's name as a tag: `kedro run --tags train`, and the Airflow
    # DAG template (templates/airflow_dag.j2) runs each task as its stage.
    for stage in STAGES:
        if stage in pipelines:
            pipelines[stage] = Pipeline(pipelines[stage], tags=stage)
    # `kedro run --pipelines X` makes Kedro import only the pipelines it needs, so a stage may
    # be missing here; `__default__` is only built whole when every stage was found.
    pipelines["__default__"] = sum((pipelines[s] for s in STAGES if s in pipelines),
                                   Pipeline([]))
    return pipelines
