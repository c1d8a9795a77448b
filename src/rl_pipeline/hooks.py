"""Project hooks."""

from __future__ import annotations

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
