"""The ``train`` parameter group: the engine and its settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_pipeline.config import PARAMETER_GROUPS, ParamGroup
from rl_pipeline.engines.verl_params import VerlParams


class TrainParams(ParamGroup):
    """``train``: which engine trains, and each engine's parameters."""

    engine: Literal["verl", "trl", "auto"] = Field(
        "verl", description="verl (GPUs, vLLM rollout), trl (CPU or GPU), or auto: verl when "
        "CUDA GPUs and vLLM are present, else trl.")
    verl: VerlParams = Field(default_factory=VerlParams, description="The verl engine.")


PARAMETER_GROUPS["train"] = TrainParams
