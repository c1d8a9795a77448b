"""Versions of merged models in the registry: registering them, finding them by alias or
folder, their weights' folder checked, and eval's results recorded on them."""

from __future__ import annotations

import logging
from datetime import date
from pathlib import Path
from typing import Any

from rl_pipeline.model_registry.names import (
    CANDIDATE,
    CHAMPION,
    EVAL_RUN_TAG,
    EVIDENCE_FILE,
    GATE_TAG,
    PATH_TAG,
    REASONS_TAG,
    REFUSED_TAG,
    SAME_WEIGHTS_TAG,
    STORAGE_TAG,
    WEIGHT_TAG_PREFIX,
    RegistryError,
    tag_value,
)
from rl_pipeline.tracking.lineage import weights_run
from rl_pipeline.tracking.stores import is_local_store

logger = logging.getLogger(__name__)

# Where a merge run behind a tracking server keeps the path of the folder it registered.
REFERENCE = "merged_model_reference"


def client() -> Any:
    import mlflow

    return mlflow.MlflowClient()


def register_merged_model(name: str, folder: str | Path, run_id: str | None,
                          tags: dict[str, Any], *, copy_weights: bool,
                          description: str = "") -> Any:
    """A new version of the registered model ``name`` for the merged model in ``folder``.

    Args:
        name: The registered model (created on first use).
        folder: The merged model, where the catalog saved it.
        run_id: The merge run.
        tags: What the version carries (:func:`version_tags`).
        copy_weights: Log the weights to the merge run (transformers flavour) and register
            that copy; else register a reference to ``folder``.
        description: The version's description.

    Returns:
        The model version.
    """
    from mlflow.exceptions import MlflowException

    registry = client()
    folder = Path(folder).absolute()
    try:
        registry.get_registered_model(name)
    except MlflowException as exc:
        if not _not_found(exc):
            raise
        registry.create_registered_model(
            name, description="Merged models of rl_pipeline (aliases: candidate, champion).")
    source = _log_weights(folder) if copy_weights else _reference(folder, run_id)
    tags = {**{k: tag_value(v) for k, v in tags.items()}, PATH_TAG: stored_path(folder),
            STORAGE_TAG: "mlflow copy" if copy_weights else "catalog reference"}
    twins = same_weights(name, tags)
    if twins:
        tags[SAME_WEIGHTS_TAG] = ",".join(twins)
        logger.warning("%s: the merged model's weight files are those of version(s) %s "
                       "(the same SHA-256 for each): the training result is unchanged since. "
                       "Registered as a new version all the same, tagged %s", name,
                       ", ".join(twins), SAME_WEIGHTS_TAG)
    version = registry.create_model_version(name, source=source, run_id=run_id, tags=tags,
                                            description=description)
    logger.info("Registered %s version %s (%s)", name, version.version, tags[STORAGE_TAG])
    return version


def weight_sums(tags: dict[str, str]) -> dict[str, str]:
    """The SHA-256 of each weight file, as a version's tags hold them."""
    return {k: v for k, v in tags.items() if k.startswith(WEIGHT_TAG_PREFIX)}


def same_weights(name: str, tags: dict[str, str]) -> list[str]:
    """The versions of ``name`` whose weight files are the ones ``tags`` describe (the same
    files, each with the same SHA-256), oldest first; none when ``tags`` name no weights."""
    sums = weight_sums(tags)
    if not sums:
        return []
    return sorted((str(v.version) for v in client().search_model_versions(f"name='{name}'")
                   if weight_sums(v.tags) == sums), key=int)


def _reference(folder: Path, run_id: str | None) -> str:
    """The source of a version that refers to the catalog's folder: the folder itself in a
    local store; behind a tracking server, which refuses a local path as a source (MLflow 3
    accepts none outside the run's artifacts), a pointer file logged to the merge run. The
    folder is the version's PATH_TAG either way."""
    import mlflow

    if run_id is None or is_local_store(mlflow.get_tracking_uri()):
        return folder.as_uri()
    client().log_text(run_id, f"{folder}\n", f"{REFERENCE}/path.txt")
    return f"runs:/{run_id}/{REFERENCE}"


def _log_weights(folder: Path) -> str:
    """Log the model in ``folder`` to the active MLflow run (transformers flavour)."""
    import mlflow
    import torch
    import transformers

    # Explicit requirements: mlflow's inference imports every optional vision/audio package.
    requirements = [f"transformers=={transformers.__version__}",
                    f"torch=={torch.__version__.split('+')[0]}", "safetensors", "accelerate"]
    info = mlflow.transformers.log_model(transformers_model=str(folder), name="merged_model",
                                         task="text-generation",
                                         pip_requirements=requirements)
    return info.model_uri


def version_tags(metadata: dict[str, Any], sources: dict[str, str], merge_run_id: str | None,
                 catalog_version: str, weights: dict[str, str]) -> dict[str, str]:
    """The tags of a new version: lineage (train and merge runs, prompt versions, identity),
    the base model, the engine, and ``sha256.<file>`` for every weight file."""
    run = metadata.get("training_run") or {}
    return {
        "train_run_id": sources.get("source.train_run_id") or weights_run(run) or "unknown",
        "merge_run_id": merge_run_id or "unknown",
        "run_identity": run.get("identity") or "unknown",
        "base_model": metadata.get("base_model") or "unknown",
        "engine": metadata.get("engine") or run.get("engine") or "unknown",
        "kind": metadata.get("kind") or "unknown",
        "catalog.version": catalog_version,
        **{k.removeprefix("source."): v for k, v in sources.items()
           if k.startswith("source.") and k.endswith("_version")},
        **{f"{WEIGHT_TAG_PREFIX}{file}": digest for file, digest in weights.items()},
    }


def stored_path(folder: str | Path) -> str:
    """``folder`` as :data:`PATH_TAG` holds it: relative to the project (the folder
    ``kedro run`` runs in), so that the tag holds on another machine with the project at
    another path; absolute when it lies outside the project."""
    folder = Path(folder).absolute()
    try:
        return folder.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(folder)


def is_folder(version: Any, folder: str | Path) -> bool:
    """Whether ``version`` was registered for ``folder`` (its :data:`PATH_TAG`)."""
    return version.tags.get(PATH_TAG) == stored_path(folder)


def version_for_folder(name: str, folder: str | Path) -> Any | None:
    """The version of ``name`` registered for ``folder``, or None."""
    for version in client().search_model_versions(f"name='{name}'"):
        if is_folder(version, folder):
            return version
    return None


def alias(name: str, alias_name: str) -> Any | None:
    """The version that ``alias_name`` points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return client().get_model_version_by_alias(name, alias_name)
    except MlflowException as exc:
        if _not_found(exc):
            return None
        raise


def _not_found(exc: Exception) -> bool:
    """Whether the registry said "no such model" or "no such alias", and nothing else: a
    store that failed to answer (a locked SQLite file, a server down) is not "no champion",
    which would let eval and promote compare with the base and replace the champion."""
    # A missing model is RESOURCE_DOES_NOT_EXIST; a missing alias INVALID_PARAMETER_VALUE.
    return getattr(exc, "error_code", None) in ("RESOURCE_DOES_NOT_EXIST",
                                                "INVALID_PARAMETER_VALUE")


def is_registered(name: str) -> bool:
    """Whether this registry has the registered model ``name``."""
    from mlflow.exceptions import MlflowException

    try:
        client().get_registered_model(name)
    except MlflowException as exc:
        if _not_found(exc):
            return False
        raise
    return True


def alias_folders(name: str) -> dict[Path, str]:
    """The folders that the aliases of ``name`` point at (none without the model), each
    with why it stays: ``registry alias champion (version 3)``."""
    held: dict[Path, str] = {}
    for role in (CHAMPION, CANDIDATE):
        version = alias(name, role)
        if version is not None and version.tags.get(PATH_TAG):
            held[Path(version.tags[PATH_TAG]).absolute()] = (
                f"registry alias {role} ({name} version {version.version})")
    return held


def mark_folder_removed(name: str, folder: Path) -> None:
    """Tag the version of ``name`` registered for ``folder``, if any, as having its folder
    removed (``kedro prune``): the version, its lineage and evidence stay."""
    version = version_for_folder(name, folder)
    if version is not None:
        client().set_model_version_tag(name, version.version, STORAGE_TAG,
                                       f"folder removed by kedro prune on {date.today()}")


def model_folder(version: Any, role: str) -> Path:
    """The folder of a registered version's weights, checked against its manifest.

    Raises:
        RegistryError: When the folder is gone.
        ManifestError: When its files differ from the manifest (named).
    """
    from rl_pipeline.model_card import check_manifest

    folder = Path(version.tags.get(PATH_TAG, ""))
    if not version.tags.get(PATH_TAG) or not folder.is_dir():
        raise RegistryError(
            f"the {role} ({version.name} version {version.version}) refers to "
            f"{version.tags.get(PATH_TAG) or 'no folder'}, which is gone. Register its model "
            f"again (kedro run --pipelines merge) or move the alias: "
            f"MlflowClient().delete_registered_model_alias('{version.name}', '{role}')")
    check_manifest(folder)
    return folder


def record_eval(name: str, version: Any, results: dict[str, str],
                evidence: dict[str, Any], eval_run_id: str | None) -> None:
    """Add eval's results to ``version`` and point ``candidate`` at it.

    ``evidence`` (the paired comparisons for the promotion gate) goes to the eval run as
    :data:`EVIDENCE_FILE`; the version's tags say where.
    """
    import mlflow

    registry = client()
    if mlflow.active_run() is not None:
        mlflow.log_dict(evidence, EVIDENCE_FILE)
    for key, value in {**results, EVAL_RUN_TAG: eval_run_id or "unknown",
                       "eval.reference": evidence["reference"]}.items():
        registry.set_model_version_tag(name, version.version, key, tag_value(value))
    # New evidence: an earlier refusal, and its reasons, were about the old one, so the
    # gate decides again.
    if REFUSED_TAG in version.tags:
        for tag in (REFUSED_TAG, REASONS_TAG, GATE_TAG):
            if tag in version.tags:
                registry.delete_model_version_tag(name, version.version, tag)
    registry.set_registered_model_alias(name, CANDIDATE, version.version)
    logger.info("%s version %s: eval results recorded, alias %s", name, version.version,
                CANDIDATE)


def read_evidence(version: Any) -> dict[str, Any]:
    """The eval evidence of ``version`` (what :func:`record_eval` logged).

    Raises:
        RegistryError: When the version has no eval, or its evidence cannot be read.
    """
    import mlflow

    run_id = version.tags.get(EVAL_RUN_TAG)
    if not run_id or run_id == "unknown":
        raise RegistryError(f"{version.name} version {version.version} has no eval results "
                            f"(no {EVAL_RUN_TAG} tag): run `kedro run --pipelines eval` on it "
                            "first")
    try:
        return mlflow.artifacts.load_dict(f"runs:/{run_id}/{EVIDENCE_FILE}")
    except Exception as exc:  # any store error: say which run and file
        raise RegistryError(f"{version.name} version {version.version}: its eval run {run_id}"
                            f" has no readable {EVIDENCE_FILE} ({exc})") from None
