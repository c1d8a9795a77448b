"""Project hooks."""

from __future__ import annotations

import os
import uuid
from typing import Any

from kedro.framework.context import KedroContext
from kedro.framework.hooks import hook_impl

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


class LineageHook:
    """Tag each stage's MLflow run with the pipeline execution it belongs to.

    The stages of one `kedro run` are separate MLflow runs; the shared
    ``pipeline_execution_id`` tag finds them together (a session of its own gets a new id).
    """

    @hook_impl(trylast=True)  # after kedro-mlflow has started the run
    def before_pipeline_run(self, run_params: dict[str, Any]) -> None:
        import mlflow

        if mlflow.active_run() is None:  # tracking disabled for this pipeline
            return
        mlflow.set_tag("pipeline_execution_id",
                       os.environ.get(EXECUTION_ID_ENV) or uuid.uuid4().hex)
