"""A standalone model from a training result, verified, with its metadata.

The training result says what it holds (:mod:`rl_pipeline.training_result`): a peft adapter,
merged into the base model and checked against base + adapter; or a whole model (all weights
trained), copied in the requested dtype and checked against its source. Merge reads nothing
else about how the model was trained. The model is built in a hidden work folder that the
caller moves into place.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_pipeline.merge import MERGE_METADATA, MergeVerificationError
from rl_pipeline.merge.lora import merge_lora, read_adapter
from rl_pipeline.merge.verify import DEFAULT_PROBES, verify_copy, verify_merge
from rl_pipeline.model_card import write_manifest
from rl_pipeline.models.identity import check_trained_from
from rl_pipeline.models.resolve import METADATA_FILE
from rl_pipeline.params import MergeParams
from rl_pipeline.runs.debris import work_dir
from rl_pipeline.runs.jsonfile import read_object
from rl_pipeline.trained_questions import FILE as TRAINED_QUESTIONS
from rl_pipeline.training_result import RECORD, TrainingResult

logger = logging.getLogger(__name__)
# Training records that travel with the model elsewhere (merge_metadata.json).
_NOT_MODEL_FILES = {RECORD, "training_args.bin"}
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


def make_standalone_model(training_result: str, base_model: str, params: MergeParams,
                          work_root: str | Path | None = None) -> MergeResult:
    """Make a standalone model from the training result, verify it, and describe it.

    Args:
        training_result: The train stage's result folder, with its record.
        base_model: The resolved base model folder.
        params: The ``merge`` parameters.
        work_root: Where to build the folder (the catalog's ``model_work_dir``, beside its
            final place); None: the system's temporary folder.

    Returns:
        The merged model, in a hidden work folder (in ``work_root``), with its
        metadata and a SHA256SUMS manifest of its files.

    Raises:
        TrainingResultError: If the folder or its record is not a training result.
        BaseModelMismatchError: If it was trained from another base model.
        AdapterError: If the adapter cannot be merged into this base (alpha 0, shapes, ...).
        MergeVerificationError: If the merged model fails verification.
    """
    result = TrainingResult.read(training_result)
    check_trained_from(result.run.get("base_model"), base_model,
                       f"The training result in {training_result}",
                       "Merge would fold its adapter into (or name as its base) weights it "
                       "was not trained from, and verify it against them.")
    # Hidden, so a crash leaves nothing that looks like a model; the caller moves it away.
    if work_root is not None:
        Path(work_root).mkdir(parents=True, exist_ok=True)
    work = work_dir("merge", work_root)
    try:
        if result.kind == "peft_adapter":
            metadata = _merge_lora(Path(base_model), Path(training_result), work, params)
        else:
            metadata = _copy_full_model(Path(training_result), work, params)
        metadata = {"base_model": read_object(Path(base_model) / METADATA_FILE).get(
                        "source", base_model),
                    "base_model_path": base_model, "training_result": training_result,
                    "kind": result.kind, "engine": result.engine, "checkpoint": result.source,
                    "export_checks": result.checks, "training_run": result.run, **metadata}
        (work / MERGE_METADATA).write_text(json.dumps(metadata, indent=2))
        # The questions it was trained on travel with the model: eval leaves them out.
        if (Path(training_result) / TRAINED_QUESTIONS).is_file():
            shutil.copy2(Path(training_result) / TRAINED_QUESTIONS, work / TRAINED_QUESTIONS)
        # Every file as verified, so a later stage can tell this model from a changed one.
        write_manifest(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return MergeResult(work, metadata)


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
            f"(compared in float32, against peft's merge rounded to {verification['dtype']})")
    if verification["adapter_effect"] <= verification["tolerance"]:
        logger.warning("The adapter changes no logit of the probe prompts by more than the "
                       "verification's tolerance (%.3g <= %.3g): the check cannot tell this "
                       "merge from none (an adapter that has hardly trained)",
                       verification["adapter_effect"], verification["tolerance"])
    elif verification["rounding_share"] > 0.5:
        logger.warning("%s rounds away %.0f%% of the adapter's effect on the logits (it changes "
                       "a logit by %.3g at most): the merged model is close to the base model; "
                       "merge.dtype=float32 keeps the whole change", verification["dtype"],
                       100 * verification["rounding_share"], verification["adapter_effect"])
    logger.info("Merged %d modules; max |logit diff| %.3g (tolerance %.3g)",
                summary["merged_modules"], verification["max_abs_diff"],
                verification["tolerance"])
    return {"adapter": str(adapter_dir),
            "lora": {"r": adapter.rank, "lora_alpha": adapter.alpha,
                     "use_rslora": adapter.use_rslora,
                     "target_modules": adapter.config.get("target_modules")},
            **summary, "verification": verification}


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


def _dtype(name: str, base: Path) -> torch.dtype:
    """The merged weights' dtype: ``name``, or for ``auto`` the one ``base`` declares."""
    if name != "auto":
        return getattr(torch, name)
    config = read_object(base / "config.json")
    declared = config.get("dtype") or config.get("torch_dtype") or "float32"
    return getattr(torch, declared) if isinstance(declared, str) else torch.float32
