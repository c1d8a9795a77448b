"""The ``merge`` group: a standalone model from the training result."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rl_pipeline.params.base import ParamGroup


class MergeParams(ParamGroup):
    """Merging the LoRA adapter into the base model (the ``merge`` group)."""

    group: ClassVar[str] = "merge"

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype of the merged weights; auto: the base model's. The merge "
        "itself computes in float32.")
    verify_probes: list[str] | None = Field(
        None, description="Prompts whose logits prove merged == base + adapter (null: three "
        "built-in probes).")
    # Registering the merged model: the registry group (rl_pipeline.params.model_registry).
