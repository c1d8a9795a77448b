"""Every parameter group, validated in one place, and the table of groups.

Each group is a pydantic model whose fields carry their default and help text, so the model
is its own reference (in the manner of TRL's ``GRPOConfig``) and the one source of every
default: ``conf/*/parameters*.yml`` set only what a configuration changes, and
``docs/parameters.md`` is generated from the models. Nodes declare their groups by type
(``data: DataParams``); Kedro instantiates them from ``params:<group>`` before the run
starts, and :meth:`ParamGroup.model_validate` words every problem at once.

This package imports nothing else of the project's but :mod:`rl_pipeline.errors`, so every
layer above may use it; the engine names that ``train.engine`` accepts live here
(:data:`rl_pipeline.params.train.ENGINES`) for that reason.
"""

from rl_pipeline.params.base import (
    FOLLOWERS,
    ConfigError,
    Follower,
    ParamGroup,
    cross_group_problems,
    disagreeing_followers,
    follow,
    resolve_followers,
)
from rl_pipeline.params.data import DataParams, DataPrepParams, FewShotExample
from rl_pipeline.params.eval import EvalParams
from rl_pipeline.params.merge import MergeParams
from rl_pipeline.params.model_registry import PromoteParams, RegistryParams
from rl_pipeline.params.reward import CustomRewardFunction, RewardParams, RewardTerm
from rl_pipeline.params.train import TrainParams

# Every parameter group, by its key in conf/*/parameters*.yml.
PARAMETER_GROUPS: dict[str, type[ParamGroup]] = {
    model.group: model for model in (DataParams, DataPrepParams, RewardParams, EvalParams,
                                     MergeParams, TrainParams, RegistryParams, PromoteParams)}

__all__ = ["FOLLOWERS", "PARAMETER_GROUPS", "ConfigError", "CustomRewardFunction", "DataParams",
           "DataPrepParams", "EvalParams", "FewShotExample", "Follower", "MergeParams",
           "ParamGroup", "PromoteParams", "RegistryParams", "RewardParams", "RewardTerm",
           "TrainParams",
           "cross_group_problems", "disagreeing_followers", "follow", "resolve_followers"]
