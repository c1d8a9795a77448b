"""Nodes of the promote pipeline: the gate on eval's evidence moves the ``champion`` alias
(:mod:`rl_pipeline.evaluation.promotion`, :mod:`rl_pipeline.registry`)."""

from __future__ import annotations

import logging
from typing import Any

from rl_pipeline import registry
from rl_pipeline.evaluation.promotion import decide_promotion
from rl_pipeline.params import ConfigError
from rl_pipeline.params.registry import PromoteParams, RegistryParams

logger = logging.getLogger(__name__)


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
    candidate = registry.alias(name, registry.CANDIDATE)
    if candidate is None:
        raise registry.RegistryError(
            f"no candidate: {name} has no version with the alias '{registry.CANDIDATE}'. "
            "Eval sets it on the model it evaluates: run the merge and eval stages first")
    if eval_registry.get("recorded") and str(eval_registry.get("version")) != str(
            candidate.version):
        logger.info("The last eval recorded version %s; the candidate is version %s",
                    eval_registry.get("version"), candidate.version)
    champion = registry.alias(name, registry.CHAMPION)
    reference = (f"champion:{champion.version}" if champion and promote.reference == "champion"
                 else "base")
    decision = {"model": name, "candidate": str(candidate.version),
                "champion_before": str(champion.version) if champion else None,
                "reference": reference, "metric": promote.metric, "guards": promote.guards}
    # Both models as merge wrote them, before anything is decided (or found decided).
    registry.model_folder(candidate, registry.CANDIDATE)
    if champion is not None:
        registry.model_folder(champion, registry.CHAMPION)
    if champion is not None and str(champion.version) == str(candidate.version):
        return {**decision, "promoted": False, "changed": False,
                "reasons": [f"version {candidate.version} is the champion already: nothing "
                            "to do"]}
    if candidate.tags.get(registry.REFUSED_TAG) == reference:
        return {**decision, "promoted": False, "changed": False,
                "reasons": [f"version {candidate.version} was refused against {reference} "
                            f"already ({candidate.tags.get('promote.reasons', '')}): nothing "
                            "to do until eval or the champion changes"]}
    evidence = registry.read_evidence(candidate)
    if evidence["reference"] != reference:
        raise registry.RegistryError(
            f"{name} version {candidate.version} was evaluated against "
            f"{evidence['reference']}, but the gate compares with {reference} now: run "
            "`kedro run --pipelines eval` again, so that both answer the same prompts")
    try:
        verdict = decide_promotion(evidence, promote.metric, promote.guards)
    except KeyError as missing:
        known = sorted(evidence["overall"])
        raise ConfigError(f"promote: eval has no comparison for {missing}; metrics it "
                          f"compares: {', '.join(known)} (a guard may name "
                          f"data_source:metric, sources: "
                          f"{', '.join(sorted(evidence.get('by_data_source', {})))})") from None
    client = registry.client()
    if verdict.promote:
        client.set_registered_model_alias(name, registry.CHAMPION, candidate.version)
        client.set_model_version_tag(name, candidate.version, "promote.promoted_over",
                                     reference)
        logger.info("Promoted %s version %s to champion (over %s)", name, candidate.version,
                    reference)
    else:
        client.set_model_version_tag(name, candidate.version, registry.REFUSED_TAG, reference)
        logger.info("Not promoted: %s", "; ".join(verdict.reasons))
    client.set_model_version_tag(name, candidate.version, "promote.reasons",
                                 "; ".join(verdict.reasons)[:5000])
    return {**decision, "promoted": verdict.promote, "changed": True,
            "reasons": verdict.reasons, "comparisons": verdict.comparisons}
