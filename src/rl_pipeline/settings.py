"""Project settings. https://docs.kedro.org/en/stable/kedro_project_setup/settings.html"""

from kedro.config import OmegaConfigLoader

from rl_pipeline.hooks import (
    LeftoversHook,
    LineageHook,
    StageInputsHook,
    StageLockHook,
    TypedParamsMlflowHook,
    WholeConfigurationHook,
)

# kedro-mlflow's hook is ours, extended for typed parameters (TypedParamsMlflowHook), so its
# entry-point instance is off. StageInputsHook comes after StageLockHook so that it runs first.
HOOKS = (WholeConfigurationHook(), StageLockHook(), StageInputsHook(), LeftoversHook(),
         TypedParamsMlflowHook(), LineageHook())
DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow",)  # its distribution name

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # Environments (conf/cpu, conf/local) override single keys of a group, not whole groups
    # (one folder of globals.yml's, say).
    "merge_strategy": {"parameters": "soft", "globals": "soft"},
}
