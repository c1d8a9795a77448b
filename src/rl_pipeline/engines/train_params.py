"""The ``train`` parameter group: the engine and its settings, and the engine choice."""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field

from rl_pipeline.config import PARAMETER_GROUPS, ParamGroup
from rl_pipeline.engines.trl_params import TrlParams
from rl_pipeline.engines.verl_params import VerlParams


class TrainParams(ParamGroup):
    """``train``: which engine trains, and each engine's parameters."""

    engine: Literal["verl", "trl", "auto"] = Field(
        "verl", description="verl (GPUs, vLLM rollout), trl (CPU or GPU), or auto: verl when "
        "CUDA GPUs and vLLM are present, else trl.")
    ray_address: str | None = Field(
        None, description="verl: an existing Ray cluster ('auto', 'ray://host:10001'); null "
        "uses RAY_ADDRESS when set, else starts a local Ray. Set it in conf/local.")
    verl: VerlParams = Field(default_factory=VerlParams, description="The verl engine.")
    trl: TrlParams = Field(default_factory=TrlParams, description="The trl engine.")


def choose_engine(engine: str, gpus_visible: int) -> tuple[str, str]:
    """The engine to train with, and why (``auto``: verl needs CUDA GPUs and vLLM)."""
    if engine != "auto":
        return engine, f"train.engine={engine}"
    has_vllm = importlib.util.find_spec("vllm") is not None
    if gpus_visible and has_vllm:
        return "verl", f"train.engine=auto: {gpus_visible} CUDA GPU(s) and vLLM found"
    missing = " and ".join(m for m, ok in (("CUDA GPUs", gpus_visible), ("vLLM", has_vllm))
                           if not ok)
    return "trl", f"train.engine=auto: no {missing} here, so trl"


PARAMETER_GROUPS["train"] = TrainParams
