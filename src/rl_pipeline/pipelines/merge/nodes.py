"""Nodes of the merge pipeline. The node calls the Kedro-free ``rl_pipeline.merge``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_pipeline import model_registry
from rl_pipeline.merge import MERGE_METADATA
from rl_pipeline.merge.standalone import make_standalone_model
from rl_pipeline.model_card import card_facts, check_manifest, render_card, weight_files, write_card
from rl_pipeline.params import MergeParams
from rl_pipeline.params.model_registry import RegistryParams
from rl_pipeline.runs.jsonfile import read_object
from rl_pipeline.tracking import lineage, mlflow_metrics


def merge_model(training_result: str, base_model: str, model_work_dir: str,
                merge: MergeParams, registry_params: RegistryParams,
                ) -> tuple[str, dict[str, Any], dict[str, dict[str, float]]]:
    """Make a standalone model from the training result (a peft adapter or a whole model,
    as its record says), verify it, and give it its model card: all in the unpublished work
    folder, which the catalog then moves into place whole. Nothing writes into the folder
    after that (eval's results go to the registry version and eval's own run).

    Returns:
        The merged model folder (moved into ``merged_model`` by the catalog), its metadata,
        and the verification numbers as MLflow metrics.
    """
    result = make_standalone_model(training_result, base_model, merge, model_work_dir)
    run = result.metadata.get("training_run") or {}
    facts = card_facts(result.metadata, registry_params.model_name or "rl_pipeline merged model",
                       registry_params.license,
                       lineage.prompt_facts(lineage.training_sources(run), run))
    write_card(result.path, render_card(facts))
    return str(result.path), result.metadata, mlflow_metrics(result.numbers)


def publish_merged_model(merged_model: str, registry_params: RegistryParams) -> dict[str, Any]:
    """With ``registry.model_name``, make the saved merged model a new version of that
    registered model (a reference to the catalog's folder, or a copy of the weights with
    ``registry.copy_weights``), tagged with its lineage (from the folder's own
    ``merge_metadata.json``) and the SHA-256 of every weight file.

    Returns:
        What was registered (``registered_model``): name, version, source, tags.
    """
    folder = Path(merged_model)
    sums = check_manifest(folder)  # the folder the catalog saved is the one merge verified
    # The folder's own record, not the catalog's merge_metadata.json: that one file is
    # written by every merge, and one started beside this run may have replaced it.
    merge_metadata = read_object(folder / MERGE_METADATA)
    run_id = lineage.active_run_id()
    sources = lineage.training_sources(merge_metadata.get("training_run") or {})
    name = registry_params.model_name
    if not name:
        return {"registered": False, "path": str(folder)}
    tags = model_registry.version_tags(merge_metadata, sources, run_id, folder.parent.name,
                                 weight_files(sums))
    run = merge_metadata.get("training_run") or {}
    version = model_registry.register_merged_model(
        name, folder, run_id, tags, copy_weights=registry_params.copy_weights,
        description=f"Merged {run.get('engine', merge_metadata.get('engine', 'unknown'))} "
                    f"{run.get('algorithm') or run.get('estimator') or 'grpo'} model from "
                    f"{merge_metadata.get('base_model')} ({run.get('steps')} steps).")
    return {"registered": True, "name": name, "version": str(version.version),
            "source": version.source, "tags": version.tags}


def merge_run_tags(merge_metadata: dict[str, Any]) -> dict[str, str]:
    """The merge run's tags: the train run whose weights it merged, that run's identity and
    the versions of the prompts it trained on (``source.*``)."""
    return lineage.training_sources(merge_metadata.get("training_run") or {})
