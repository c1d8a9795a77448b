"""A standalone model from a training result, verified, with its metadata.

The training result is the LoRA adapter when there is one; a whole model when the trl engine
fine-tuned all weights (``apply_lora: false``), which is copied in the requested dtype and
checked against its source; otherwise the newest verl FSDP checkpoint, converted by verl's
model merger (a LoRA run's checkpoint converts to base weights plus an adapter, which is then
merged). The model is built in a hidden work folder that the caller moves into place.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_pipeline.config import MergeParams
from rl_pipeline.debris import temporary_work_dir, work_dir
from rl_pipeline.engines import TRAINING_RUN
from rl_pipeline.jsonfile import read_object
from rl_pipeline.merge import MERGE_METADATA, MergeVerificationError
from rl_pipeline.merge.fsdp import (
    convert_fsdp_checkpoint,
    latest_actor_checkpoint,
    verify_conversion,
)
from rl_pipeline.merge.lora import ADAPTER_CONFIG, merge_lora, read_adapter
from rl_pipeline.merge.verify import DEFAULT_PROBES, verify_copy, verify_merge
from rl_pipeline.models.resolve import METADATA_FILE

logger = logging.getLogger(__name__)
# Training records that travel with the model elsewhere (merge_metadata.json).
_NOT_MODEL_FILES = {TRAINING_RUN, "training_args.bin"}
_VERIFICATION_NUMBERS = ("max_abs_diff", "tolerance", "max_abs_logit")


@dataclass(frozen=True)
class MergeResult:
    """The merged model folder and its metadata (also written into it as ``MERGE_METADATA``)."""

    path: Path
    metadata: dict[str, Any]

    @property
    def numbers(self) -> dict[str, float]:
        """The verification numbers and the count of merged modules, for tracking."""
        verification = self.metadata["verification"]
        numbers = {name: float(verification[name]) for name in _VERIFICATION_NUMBERS
                   if name in verification}
        return {**numbers, "merged_modules": float(self.metadata.get("merged_modules", 0))}


def make_standalone_model(lora_adapter: str | None, train_checkpoints: str | None,
                          base_model: str, params: MergeParams) -> MergeResult:
    """Make a standalone model from the training result, verify it, and describe it.

    Args:
        lora_adapter: The adapter folder (peft's layout, or verl's model merger output with a
            ``lora_adapter/`` subfolder), a whole model (trl, full fine-tuning), or None.
        train_checkpoints: verl's checkpoint folder, or None.
        base_model: The resolved base model folder.
        params: The ``merge`` parameters.

    Returns:
        The merged model, in a hidden work folder (in ``params.scratch_dir``), and its
        metadata; with ``params.registered_model_name`` also registered in MLflow.

    Raises:
        ValueError: If there is nothing to merge.
        AdapterError: If the adapter cannot be merged into this base (alpha 0, shapes, ...).
        MergeVerificationError: If the merged model fails verification.
    """
    training_run = Path(lora_adapter or train_checkpoints or ".") / TRAINING_RUN
    kind, source = _training_result(lora_adapter, train_checkpoints)
    # Hidden, so a crash leaves nothing that looks like a model; the caller moves it away.
    if params.scratch_dir:
        Path(params.scratch_dir).mkdir(parents=True, exist_ok=True)
    work = work_dir("merge", params.scratch_dir)
    try:
        if kind == "adapter":
            metadata = _merge_lora(Path(base_model), source, work, params)
        elif kind == "full_model":
            metadata = _copy_full_model(source, work, params)
        else:
            metadata = _merge_checkpoint(source, Path(base_model), work, params)
        metadata = {"base_model": read_object(Path(base_model) / METADATA_FILE).get(
                        "source", base_model),
                    "base_model_path": base_model,
                    "training_run": read_object(training_run) or None, **metadata}
        (work / MERGE_METADATA).write_text(json.dumps(metadata, indent=2))
        if params.registered_model_name:
            metadata["registered_model"] = {"name": params.registered_model_name,
                                            "uri": _register(work, params.registered_model_name)}
            (work / MERGE_METADATA).write_text(json.dumps(metadata, indent=2))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return MergeResult(work, metadata)


def _register(folder: Path, name: str) -> str:
    """Log the model in ``folder`` to the active MLflow run (transformers flavour) and
    register it as ``name``.

    Returns:
        The logged model's URI.
    """
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


def _training_result(lora_adapter: str | None,
                     train_checkpoints: str | None) -> tuple[str, Path]:
    """What the model is made from: ``adapter``, ``full_model`` or ``checkpoint``, and where."""
    if lora_adapter is not None:
        if _holds_model(Path(lora_adapter)):
            return "full_model", Path(lora_adapter)
        if _holds_adapter(Path(lora_adapter)):
            return "adapter", _adapter_folder(Path(lora_adapter))
        # verl's full fine-tuning run records itself here; its weights are in the checkpoint
        # it names (in the run identity's folder under train_checkpoints).
        recorded = read_object(Path(lora_adapter) / TRAINING_RUN).get("checkpoint")
        logger.info("%s holds no adapter (full fine-tuning): converting the checkpoint %s",
                    lora_adapter, recorded or "newest in train_checkpoints")
        if recorded and Path(recorded).is_dir():
            return "checkpoint", Path(recorded)
    actor = latest_actor_checkpoint(train_checkpoints) if train_checkpoints else None
    if actor is None:
        raise ValueError("nothing to merge: no lora_adapter and no verl checkpoint in "
                         "train_checkpoints; run the train stage first")
    return "checkpoint", actor


def _merge_lora(base: Path, adapter_dir: Path, out: Path, params: MergeParams) -> dict[str, Any]:
    adapter = read_adapter(adapter_dir)
    dtype = _dtype(params.dtype, base)
    summary = merge_lora(base, adapter, out, dtype)
    verification = verify_merge(base, adapter_dir, out,
                                tuple(params.verify_probes or DEFAULT_PROBES), dtype)
    if not verification["passed"]:
        raise MergeVerificationError(
            f"merged model differs from base + adapter: max |logit diff| "
            f"{verification['max_abs_diff']:.3g} > tolerance {verification['tolerance']:.3g} "
            f"({verification['dtype']})")
    logger.info("Merged %d modules; max |logit diff| %.3g (tolerance %.3g)",
                summary["merged_modules"], verification["max_abs_diff"],
                verification["tolerance"])
    return {"adapter": str(adapter_dir),
            "lora": {"r": adapter.rank, "lora_alpha": adapter.alpha,
                     "use_rslora": adapter.use_rslora,
                     "target_modules": adapter.config.get("target_modules")},
            **summary, "verification": verification}


def _merge_checkpoint(actor: Path, base: Path, out: Path, params: MergeParams) -> dict[str, Any]:
    with temporary_work_dir("convert", params.scratch_dir) as scratch:
        converted = convert_fsdp_checkpoint(actor, Path(scratch) / "converted")
        adapter_dir = converted / "lora_adapter"
        if (adapter_dir / ADAPTER_CONFIG).is_file():
            adapter_dir = adapter_dir.rename(Path(scratch) / "lora_adapter")
            # A LoRA-only checkpoint (verl's checkpoint.save_lora_only) converts to the
            # adapter alone: its base weights are the (frozen) base model's.
            into = converted if _holds_model(converted) else base
            return {"checkpoint": str(actor), **_merge_lora(into, adapter_dir, out, params)}
        verification = verify_conversion(actor, converted)
        if not verification["passed"]:
            raise MergeVerificationError(f"the converted checkpoint {actor} does not match "
                                         f"its shards:\n{verification['error']}")
        for item in converted.iterdir():
            item.rename(out / item.name)
    logger.info("Converted the full fine-tuning checkpoint %s", actor)
    config = read_object(out / "config.json")
    return {"checkpoint": str(actor), "adapter": None,
            "dtype": config.get("dtype") or config.get("torch_dtype"),
            "verification": verification}


def _copy_full_model(source: Path, out: Path, params: MergeParams) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    dtype = _dtype(params.dtype, source)
    files = [f for f in source.iterdir() if f.is_file() and f.name not in _NOT_MODEL_FILES]
    if params.dtype == "auto":
        for file in files:
            shutil.copy2(file, out / file.name)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
        model.save_pretrained(str(out))
        del model
        for file in files:  # the tokenizer and anything else save_pretrained does not write
            if not (out / file.name).exists() and not file.name.startswith("model"):
                shutil.copy2(file, out / file.name)
    verification = verify_copy(source, out, tuple(params.verify_probes or DEFAULT_PROBES), dtype)
    if not verification["passed"]:
        raise MergeVerificationError(
            f"the copy of {source} differs from it: max |logit diff| "
            f"{verification['max_abs_diff']:.3g} > tolerance {verification['tolerance']:.3g}")
    logger.info("Copied the fully fine-tuned model %s (%s)", source, verification["dtype"])
    return {"full_model": str(source), "adapter": None, "dtype": verification["dtype"],
            "verification": verification}


def _holds_model(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file())


def _holds_adapter(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file() or (path / "lora_adapter" / ADAPTER_CONFIG).is_file()


def _adapter_folder(path: Path) -> Path:
    # verl's model merger writes the adapter into a lora_adapter/ subfolder.
    if not (path / ADAPTER_CONFIG).is_file() and (path / "lora_adapter" / ADAPTER_CONFIG).is_file():
        return path / "lora_adapter"
    return path


def _dtype(name: str, base: Path) -> torch.dtype:
    """The merged weights' dtype: ``name``, or for ``auto`` the one ``base`` declares."""
    if name != "auto":
        return getattr(torch, name)
    config = read_object(base / "config.json")
    declared = config.get("dtype") or config.get("torch_dtype") or "float32"
    return getattr(torch, declared) if isinstance(declared, str) else torch.float32
