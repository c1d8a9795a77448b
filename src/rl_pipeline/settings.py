"""Project settings. https://docs.kedro.org/en/stable/kedro_project_setup/settings.html"""

from kedro.config import OmegaConfigLoader

from rl_pipeline.hooks import (
    LeftoversHook,
    LineageHook,
    ParameterValidationHook,
    StageLockHook,
)

# kedro-mlflow registers its own hook through its entry point.
HOOKS = (ParameterValidationHook(), StageLockHook(), LeftoversHook(), LineageHook())

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # Environments (conf/cpu, conf/local) override single keys of a group, not whole groups.
    "merge_strategy": {"parameters": "soft"},
}
