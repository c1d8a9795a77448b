"""The ``registry`` group (merged models in MLflow's Model Registry) and the ``promote`` group
(the gate that moves the ``champion`` alias)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from rl_pipeline.params.base import ParamGroup

# Below this many prompts the percentile bootstrap's interval is known to be too narrow: it
# sees only the differences these prompts happen to show (3 prompts that all gained: [+1, +1]).
# The gate's default minimum, and where eval's report says to read an interval as rough.
FEW_PROMPTS = 20


class RegistryParams(ParamGroup):
    """``registry``: where merged models are registered, and how."""

    group: ClassVar[str] = "registry"

    model_name: str | None = Field(
        "rl_pipeline", description="The registered model in MLflow's Model Registry that "
        "each merged model becomes a new version of; null: no registry (merge, eval and "
        "promote then leave MLflow's registry alone, and promote refuses to run).")
    copy_weights: bool = Field(
        False, description="Log the merged weights into MLflow (transformers flavour) and "
        "register that copy. Off by default: the version refers to the catalog's folder, so "
        "gigabytes are not uploaded twice; but the version then lives only as long as that "
        "folder (promote and eval check its SHA256SUMS).")
    license: str = Field(
        "other", description="The license the model card declares (the base model's: "
        "apache-2.0 for Qwen2.5 and SmolLM2).")


class PromoteParams(ParamGroup):
    """``promote``: when a candidate replaces the champion (docs/operations.md)."""

    group: ClassVar[str] = "promote"

    metric: str = Field(
        "mean_reward", description="The metric over all eval prompts the candidate must beat "
        "the reference on beyond noise (the paired 95% interval excludes 0 and the sign test "
        "of the prompts that changed agrees): the champion's, or the base model's when there "
        "is no champion yet (e.g. strict_accuracy, pass_at_1). For a rate that must not rise "
        "(truncation_rate, ...) or mean_response_tokens, beating is falling beyond noise.")
    min_prompts: int = Field(
        FEW_PROMPTS, ge=2, description="The fewest prompts the comparison with the reference "
        "must rest on for the gate to promote. Below about 20 a percentile bootstrap's "
        "interval is far too narrow (3 prompts that all gained: [+1, +1]); the champion's "
        "comparison uses only the prompts it was not trained on, which can be few after the "
        "validation data changed.")
    guards: dict[str, float] = Field(
        default_factory=lambda: {"truncation_rate": 0.0, "repetition_rate": 0.0,
                                 "no_reasoning_rate": 0.0},
        description="Metrics that must not get worse beyond a tolerance, {metric or "
        "data_source:metric: tolerance}: a rate (truncation, repetition, no reasoning) must "
        "not rise with its whole interval above the tolerance; another metric must not fall "
        "with its whole interval below minus the tolerance (either beyond noise: the sign "
        "test agreeing).")
    reference: Literal["champion", "base"] = Field(
        "champion", description="What eval compares the candidate with for the gate: the "
        "champion when there is one (else the base model), or always the base model.")

    @field_validator("guards")
    @classmethod
    def _tolerances(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [f"promote.guards.{k}={v!r}: a tolerance of 0 or more"
               for k, v in value.items() if v < 0]
        if bad:  # a rule over a mapping: _describe shows the message alone, so it names each
            raise ValueError("\n  - ".join(bad))
        return value
