"""The promote stage's registry work: find the candidate and the reference, decide on eval's
evidence (:func:`rl_pipeline.evaluation.promotion.decide_promotion`), move ``champion`` or
record the refusal."""

from __future__ import annotations

import json
import logging
from typing import Any

from rl_pipeline.evaluation.promotion import decide_promotion
from rl_pipeline.model_registry.names import (
    CANDIDATE,
    CHAMPION,
    GATE_TAG,
    PROMOTE_RUN_TAG,
    PROMOTED_TAG,
    REASONS_TAG,
    REFUSED_TAG,
    SAME_WEIGHTS_TAG,
    RegistryError,
    tag_value,
)
from rl_pipeline.model_registry.versions import alias, client, model_folder, read_evidence
from rl_pipeline.params import ConfigError
from rl_pipeline.params.model_registry import PromoteParams
from rl_pipeline.tracking.lineage import active_run_id

logger = logging.getLogger(__name__)


def promote_candidate(name: str, promote: PromoteParams,
                      last_recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """Move ``champion`` of ``name`` to its ``candidate`` when it beats the reference beyond
    the paired interval and no guard is worse beyond its tolerance; otherwise tag the
    refusal.

    Args:
        name: The registered model.
        promote: The gate's parameters (metric, guards, reference).
        last_recorded: What the last eval recorded (logged when it names another version).

    Returns:
        The decision: the versions, whether it was promoted, the rule's numbers and reasons;
        ``changed`` is false when there was nothing to decide.

    Raises:
        ConfigError: With a metric or guard eval lacks.
        RegistryError: Without a candidate, with a candidate whose eval is missing or was
            made against another reference, or a champion whose weights are gone.
        ManifestError: When a model's files differ from its manifest.
    """
    candidate = alias(name, CANDIDATE)
    if candidate is None:
        raise RegistryError(
            f"no candidate: {name} has no version with the alias '{CANDIDATE}'. "
            "Eval sets it on the model it evaluates: run the merge and eval stages first")
    if last_recorded and last_recorded.get("recorded") and \
            str(last_recorded.get("version")) != str(candidate.version):
        logger.info("The last eval recorded version %s; the candidate is version %s",
                    last_recorded.get("version"), candidate.version)
    champion = alias(name, CHAMPION)
    reference = (f"champion:{champion.version}" if champion and promote.reference == "champion"
                 else "base")
    decision = {"model": name, "candidate": str(candidate.version),
                "champion_before": str(champion.version) if champion else None,
                "reference": reference, "metric": promote.metric, "guards": promote.guards}
    # Both models as merge wrote them, before anything is decided (or found decided).
    model_folder(candidate, CANDIDATE)
    if champion is not None:
        model_folder(champion, CHAMPION)
    if champion is not None and str(champion.version) == str(candidate.version):
        return {**decision, "promoted": False, "changed": False,
                "reasons": [f"version {candidate.version} is the champion already: nothing "
                            "to do"]}
    gate = json.dumps({"metric": promote.metric, "guards": promote.guards,
                       "min_prompts": promote.min_prompts}, sort_keys=True)
    if candidate.tags.get(REFUSED_TAG) == reference and candidate.tags.get(GATE_TAG) == gate:
        return {**decision, "promoted": False, "changed": False,
                "reasons": [f"version {candidate.version} was refused against {reference} "
                            f"already, by the same gate ({candidate.tags.get(REASONS_TAG, '')})"
                            ": nothing to do until eval, the champion or the promote "
                            "parameters change"]}
    evidence = read_evidence(candidate)
    if evidence["reference"] != reference:
        raise RegistryError(
            f"{name} version {candidate.version} was evaluated against "
            f"{evidence['reference']}, but the gate compares with {reference} now: run "
            "`kedro run --pipelines eval` again, so that both answer the same prompts")
    try:
        verdict = decide_promotion(evidence, promote.metric, promote.guards,
                                   promote.min_prompts)
    except KeyError as missing:
        known = sorted(evidence["overall"])
        raise ConfigError(f"promote: eval has no comparison for {missing}; metrics it "
                          f"compares: {', '.join(known)} (a guard may name "
                          f"data_source:metric, sources: "
                          f"{', '.join(sorted(evidence.get('by_data_source', {})))})") from None
    reasons = list(verdict.reasons)
    if champion is not None and str(champion.version) in \
            candidate.tags.get(SAME_WEIGHTS_TAG, "").split(","):
        reasons.append(f"version {candidate.version} has champion:{champion.version}'s "
                       "weights (the same SHA-256 for each file): its training result is "
                       "the champion's")
    registry = client()
    decided, earlier = (PROMOTED_TAG, REFUSED_TAG) if verdict.promote else (REFUSED_TAG,
                                                                            PROMOTED_TAG)
    if verdict.promote:
        registry.set_registered_model_alias(name, CHAMPION, candidate.version)
        logger.info("Promoted %s version %s to champion (over %s)", name, candidate.version,
                    reference)
    else:
        logger.info("Not promoted: %s", "; ".join(reasons))
    registry.set_model_version_tag(name, candidate.version, decided, reference)
    if earlier in candidate.tags:  # an earlier decision's tag would contradict this one's
        registry.delete_model_version_tag(name, candidate.version, earlier)
    registry.set_model_version_tag(name, candidate.version, REASONS_TAG,
                                   tag_value("; ".join(reasons)))
    registry.set_model_version_tag(name, candidate.version, GATE_TAG, tag_value(gate))
    if (run_id := active_run_id()) is not None:
        registry.set_model_version_tag(name, candidate.version, PROMOTE_RUN_TAG, run_id)
    return {**decision, "promoted": verdict.promote, "changed": True,
            "reasons": reasons, "comparisons": verdict.comparisons}
