"""Nodes of the promote pipeline: the gate on eval's evidence moves the ``champion`` alias
(:func:`rl_pipeline.model_registry.promote_candidate`)."""

from __future__ import annotations

from typing import Any

from rl_pipeline import model_registry
from rl_pipeline.params import ConfigError
from rl_pipeline.params.model_registry import PromoteParams, RegistryParams


def promote_candidate(eval_registry: dict[str, Any], registry_params: RegistryParams,
                      promote: PromoteParams) -> dict[str, Any]:
    """Move ``champion`` to the ``candidate`` when it beats the reference beyond the paired
    interval and no guard is worse beyond its tolerance; otherwise leave it.

    ``eval_registry`` (what the last eval recorded) orders the stage after eval; the
    registry's ``candidate`` alias says what is decided.

    Returns:
        The decision (``promotion_decision``): the versions, whether it was promoted, the
        rule's numbers and reasons; ``changed`` is false when there was nothing to decide.

    Raises:
        ConfigError: Without a registered model, or with a metric or guard eval lacks.
        RegistryError: Without a candidate, with a candidate whose eval is missing or was
            made against another reference, or a champion whose weights are gone.
        ManifestError: When a model's files differ from its manifest.
    """
    name = registry_params.model_name
    if not name:
        raise ConfigError("registry.model_name=None: promote moves aliases of a registered "
                          "model; set registry.model_name (default rl_pipeline) and merge")
    return model_registry.promote_candidate(name, promote, eval_registry)


def promote_run_tags(promotion_decision: dict[str, Any]) -> dict[str, str]:
    """The promote run's tags: what the gate decided, between which versions, and why."""
    decision = promotion_decision
    return {"promote.promoted": str(decision["promoted"]).lower(),
            "promote.changed": str(decision["changed"]).lower(),
            "promote.candidate": decision["candidate"],
            # Not promote.reference: that is the parameter (champion), this what it met.
            "promote.compared_with": decision["reference"],
            "promote.reasons": "; ".join(decision["reasons"])}
