"""Nodes of the merge pipeline."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from rl_pipeline.config import MergeParams, parse_params
from rl_pipeline.merge.lora import ADAPTER_CONFIG, merge_lora, read_adapter
from rl_pipeline.merge.verify import DEFAULT_PROBES, verify_merge
from rl_pipeline.models.resolve import METADATA_FILE

logger = logging.getLogger(__name__)
MERGE_METADATA = "merge_metadata.json"
TRAINING_RUN = "training_run.json"  # written beside the adapter by the train stage


class MergeVerificationError(RuntimeError):
    """The merged model's logits differ from base + adapter beyond the tolerance."""


def merge_adapter(lora_adapter: str | None, base_model: str, merge: dict[str, Any]
                  ) -> tuple[str, dict[str, Any], dict[str, dict[str, float]]]:
    """Merge the LoRA adapter into the base model, verify it, and describe the result.

    Args:
        lora_adapter: The adapter folder (peft's layout, or verl's model merger output with a
            ``lora_adapter/`` subfolder), or None when training has not produced one.
        base_model: The resolved base model folder.
        merge: The ``merge`` parameter group.

    Returns:
        The merged model folder (moved into ``merged_model`` by the catalog), its metadata,
        and the verification numbers as MLflow metrics.

    Raises:
        ValueError: If there is no adapter.
        AdapterError: If the adapter cannot be merged into this base (alpha 0, shapes, ...).
        MergeVerificationError: If the merged logits differ beyond the tolerance.
    """
    params = parse_params(MergeParams, merge, "merge")
    if lora_adapter is None:
        raise ValueError("no lora_adapter to merge: run the train stage first, or point the "
                         "lora_adapter catalog entry at an adapter folder")
    adapter_dir = _adapter_folder(Path(lora_adapter))
    adapter = read_adapter(adapter_dir)
    dtype = _dtype(params.dtype, Path(base_model))
    # Hidden, so a crash leaves nothing that looks like a model; the catalog moves it away.
    if params.scratch_dir:
        Path(params.scratch_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".merge-", dir=params.scratch_dir))
    try:
        summary = merge_lora(base_model, adapter, work, dtype)
        verification = verify_merge(base_model, adapter_dir, work,
                                    tuple(params.verify_probes or DEFAULT_PROBES), dtype)
        if not verification["passed"]:
            raise MergeVerificationError(
                f"merged model differs from base + adapter: max |logit diff| "
                f"{verification['max_abs_diff']:.3g} > tolerance "
                f"{verification['tolerance']:.3g} ({verification['dtype']})")
        metadata = {
            "base_model": _read_json(Path(base_model) / METADATA_FILE).get("source", base_model),
            "base_model_path": base_model,
            "adapter": str(adapter_dir),
            "training_run": _read_json(adapter_dir / TRAINING_RUN) or None,
            "lora": {"r": adapter.rank, "lora_alpha": adapter.alpha,
                     "use_rslora": adapter.use_rslora,
                     "target_modules": adapter.config.get("target_modules")},
            **summary,
            "verification": verification,
        }
        (work / MERGE_METADATA).write_text(json.dumps(metadata, indent=2))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    logger.info("Merged %d modules; max |logit diff| %.3g (tolerance %.3g)",
                summary["merged_modules"], verification["max_abs_diff"],
                verification["tolerance"])
    if params.registered_model_name:
        metadata["registered_model"] = {"name": params.registered_model_name,
                                        "uri": _register(work, params.registered_model_name)}
        (work / MERGE_METADATA).write_text(json.dumps(metadata, indent=2))
    metrics = {name: {"value": float(verification[name]), "step": 0}
               for name in ("max_abs_diff", "tolerance", "max_abs_logit")}
    metrics["merged_modules"] = {"value": float(summary["merged_modules"]), "step": 0}
    return str(work), metadata, metrics


def _adapter_folder(path: Path) -> Path:
    # verl's model merger writes the adapter into a lora_adapter/ subfolder.
    if not (path / ADAPTER_CONFIG).is_file() and (path / "lora_adapter" / ADAPTER_CONFIG).is_file():
        return path / "lora_adapter"
    return path


def _dtype(name: str, base: Path) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    config = _read_json(base / "config.json")
    declared = config.get("dtype") or config.get("torch_dtype") or "float32"
    return getattr(torch, declared) if isinstance(declared, str) else torch.float32


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _register(folder: Path, name: str) -> str:
    import mlflow
    import transformers

    logger.info("Logging the merged model to MLflow and registering it as %s", name)
    # Explicit requirements: mlflow's inference imports every optional vision/audio package.
    requirements = [f"transformers=={transformers.__version__}",
                    f"torch=={torch.__version__.split('+')[0]}", "safetensors", "accelerate"]
    info = mlflow.transformers.log_model(transformers_model=str(folder), name="merged_model",
                                         task="text-generation", registered_model_name=name,
                                         pip_requirements=requirements)
    return info.model_uri
