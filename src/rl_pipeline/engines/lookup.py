"""The engines by name, and the choice of one for ``train.engine: auto``."""

from __future__ import annotations

import importlib
import importlib.util

from rl_pipeline.engines.base import Engine
from rl_pipeline.params.train import ENGINES


def get_engine(name: str) -> Engine:
    """The engine called ``name`` (a key of :data:`~rl_pipeline.params.train.ENGINES`),
    imported on first use: verl and trl take seconds to import."""
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def choose_engine(engine: str, gpus_visible: int,
                  ray_address: str | None = None) -> tuple[str, str]:
    """The engine to train with, and why (``auto``: verl needs CUDA GPUs and vLLM, here or
    on the Ray cluster at ``ray_address``, whose nodes the verl preflight checks)."""
    if engine != "auto":
        return engine, f"train.engine={engine}"
    if ray_address:
        return "verl", f"train.engine=auto: a Ray cluster at {ray_address} trains"
    has_vllm = importlib.util.find_spec("vllm") is not None
    if gpus_visible and has_vllm:
        return "verl", f"train.engine=auto: {gpus_visible} CUDA GPU(s) and vLLM found"
    missing = " and ".join(m for m, ok in (("CUDA GPUs", gpus_visible), ("vLLM", has_vllm))
                           if not ok)
    return "trl", f"train.engine=auto: no {missing} here, so trl"
