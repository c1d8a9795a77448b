"""The verl engine's export: its newest FSDP checkpoint as a training result, through verl's
own model merger.

verl's merger runs on CPU. For full fine-tuning it writes the trained weights (a whole
``hf_model``, checked with verl's ``model_merger test``); for a LoRA run, the base weights plus
a ``lora_adapter/`` folder, of which the export keeps the adapter (a ``peft_adapter``: its base
weights are the frozen base model's). A LoRA run saved with verl's ``checkpoint.save_lora_only``
holds only the adapter's factors; it converts to the ``lora_adapter/`` folder alone.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from rl_pipeline.runs.debris import temporary_work_dir, work_dir
from rl_pipeline.training_result import ADAPTER_CONFIG, TrainingResult

logger = logging.getLogger(__name__)

LATEST = "latest_checkpointed_iteration.txt"


class ConversionError(RuntimeError):
    """verl's merger wrote a model that does not match the checkpoint's shards."""


def export_result(checkpoints: str | Path, scratch_dir: str | Path,
                  summary: dict[str, Any]) -> Path:
    """The newest checkpoint in ``checkpoints`` as a training result folder (hidden, under
    ``scratch_dir``; the catalog moves it into place).

    Raises:
        RuntimeError: If verl left no checkpoint, or its merger fails.
        ConversionError: If a whole model's conversion differs from the checkpoint.
    """
    actor = latest_actor_checkpoint(checkpoints)
    if actor is None:
        raise RuntimeError(f"verl finished without a checkpoint in {checkpoints} "
                           f"({LATEST} is missing); set train.verl.trainer_save_freq")
    Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    # Hidden names: a crash leaves nothing that looks like a result; the catalog moves it.
    out = work_dir("training-result", scratch_dir)
    try:
        with temporary_work_dir("convert", scratch_dir) as scratch:
            converted = convert_fsdp_checkpoint(actor, Path(scratch) / "converted")
            adapter = converted / "lora_adapter"
            if (adapter / ADAPTER_CONFIG).is_file():
                kind, checks, source = "peft_adapter", {}, adapter
            else:
                checks = verify_conversion(actor, converted)
                if not checks["passed"]:
                    raise ConversionError(f"the converted checkpoint {actor} does not match "
                                          f"its shards:\n{checks['error']}")
                kind, source = "hf_model", converted
            for item in source.iterdir():
                item.rename(out / item.name)
        logger.info("Exported %s from %s", kind, actor)
        TrainingResult(kind=kind, engine="verl", run=summary, source=str(actor),
                       checks=checks).write(out)
        return out
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def latest_step(checkpoints: str | Path) -> int:
    """The step of the newest checkpoint verl recorded in ``checkpoints`` (its
    ``latest_checkpointed_iteration.txt``); 0 when there is none. A record that does not
    hold a step (:func:`repair_latest`) reads as the newest complete checkpoint."""
    text = _record(checkpoints)
    if text is None:
        return 0
    if text.isdigit():
        return int(text)
    complete = complete_steps(checkpoints)
    return complete[-1] if complete else 0


def _record(checkpoints: str | Path) -> str | None:
    """What verl's record of the newest step holds, stripped; None when there is none."""
    marker = Path(checkpoints) / LATEST
    return marker.read_text(errors="replace").strip() if marker.is_file() else None


def _step_folders(checkpoints: str | Path) -> dict[int, Path]:
    """``checkpoints``' ``global_step_N`` folders by step, in step order."""
    folders = {int(f.name.removeprefix("global_step_")): f
               for f in Path(checkpoints).glob("global_step_*")
               if f.name.removeprefix("global_step_").isdigit()}
    return dict(sorted(folders.items()))


def complete_steps(checkpoints: str | Path) -> list[int]:
    """The steps of ``checkpoints`` whose ``global_step_N`` verl finished writing, in order:
    the actor's FSDP state and config, and the dataloader's state (``data.pt``, written
    after the actor's and before the record of the newest step)."""
    return [step for step, folder in _step_folders(checkpoints).items()
            if (folder / "data.pt").is_file() and (folder / "actor/fsdp_config.json").is_file()
            and any((folder / "actor").glob("model_world_size_*"))]


def drop_unkept(checkpoints: str | Path, keep: int | None) -> list[int]:
    """Delete the actor checkpoints beyond the newest ``keep`` (verl's
    ``trainer.max_actor_ckpt_to_keep``) that verl left behind, never the recorded newest.

    verl deletes only what it saved in the same process (``previous_saved_paths``), so each
    interrupted run left its checkpoints for good: a full model and optimizer state each on
    a GPU, beyond the disk the preflight planned for. Called after a run that succeeded;
    verl's own deletion removes ``global_step_N/actor`` and keeps the small rest
    (``data.pt``), and so does this.

    Returns:
        The steps whose actor checkpoints were deleted.
    """
    if not keep or keep <= 0:
        return []
    actors = {step: folder / "actor" for step, folder in _step_folders(checkpoints).items()
              if (folder / "actor").is_dir()}
    newest = latest_step(checkpoints)
    dropped = [s for s in list(actors)[:-keep] if s != newest]
    for step in dropped:
        shutil.rmtree(actors[step])
    if dropped:
        logger.info("Deleted the actor checkpoints of steps %s in %s, which an interrupted "
                    "run left beyond trainer_max_actor_ckpt_to_keep=%d", dropped, checkpoints,
                    keep)
    return dropped


def repair_latest(checkpoints: str | Path) -> int | None:
    """Rewrite verl's record of the newest step when it holds no step, and say so.

    verl writes ``latest_checkpointed_iteration.txt`` in place, with neither a flush nor a
    rename (``trainer_base.py``), so a power loss can leave it empty; verl's own resume then
    raised ``ValueError: invalid literal for int()`` on every rerun until the file was
    deleted by hand. It is rewritten (atomically) with the newest complete checkpoint's
    step, or removed when there is none (the run trains from step 0).

    Returns:
        The step now recorded, 0 when the record was removed; None when it needed nothing.
    """
    from rl_pipeline.runs.staging import staged

    marker = Path(checkpoints) / LATEST
    text = _record(checkpoints)
    if text is None or text.isdigit():
        return None
    complete = complete_steps(checkpoints)
    if not complete:
        marker.unlink()
        logger.warning("%s held %r, not a step, and no checkpoint in %s is complete: removed; "
                       "the run trains from step 0", marker, text[:40], checkpoints)
        return 0
    with staged(marker) as staging:
        staging.write_text(str(complete[-1]))
    logger.warning("%s held %r, not a step (a write cut short): rewritten to %d, the newest "
                   "complete checkpoint in %s", marker, text[:40], complete[-1], checkpoints)
    return complete[-1]


def latest_actor_checkpoint(checkpoints: str | Path) -> Path | None:
    """``global_step_N/actor`` of the newest checkpoint verl recorded, or None."""
    step = latest_step(checkpoints)
    actor = Path(checkpoints) / f"global_step_{step}" / "actor"
    return actor if step and actor.is_dir() else None


def convert_fsdp_checkpoint(actor_dir: str | Path, out_dir: str | Path) -> Path:
    """``python -m verl.model_merger merge --backend fsdp`` on a ``global_step_N/actor``.

    Raises:
        FileNotFoundError: If ``actor_dir`` is not an FSDP actor checkpoint.
        RuntimeError: If verl's merger fails; its output is included.
    """
    actor_dir = Path(actor_dir)
    if not (actor_dir / "fsdp_config.json").is_file():
        raise FileNotFoundError(f"{actor_dir} is not a verl FSDP actor checkpoint (no "
                                "fsdp_config.json)")
    if is_lora_only_checkpoint(actor_dir):
        _verl_lora_adapter(actor_dir, out_dir)
    else:
        _verl_merger("merge", "--local_dir", str(actor_dir), "--target_dir", str(out_dir))
    return Path(out_dir)


def is_lora_only_checkpoint(actor_dir: str | Path) -> bool:
    """Whether the checkpoint holds only LoRA factors (verl's ``checkpoint.save_lora_only``):
    verl's own test on the rank-0 shard (``BaseCheckpointManager.is_lora_only_state_dict``,
    verl/utils/checkpoint/checkpoint_manager.py). The shard is memory-mapped, not read."""
    import torch

    config = json.loads((Path(actor_dir) / "fsdp_config.json").read_text())
    shard = Path(actor_dir) / f"model_world_size_{config.get('world_size')}_rank_0.pt"
    try:
        keys = list(torch.load(shard, map_location="cpu", mmap=True, weights_only=False))
    except Exception:  # unreadable here: verl's merger says what is wrong with it
        return False
    return bool(keys) and all("lora_" in k or ".adapter_" in k for k in keys)


# verl's FSDP merger up to its adapter step (FSDPModelMerger.merge_and_save, then
# BaseModelMerger.save_lora_adapter). Its full merge cannot take a LoRA-only checkpoint: it
# writes the adapter, then fails on the base model it has no weights for
# (base_model_merger.py save_hf_model_and_tokenizer -> validate_hf_model_output).
_LORA_ADAPTER_ONLY = """
import os, sys
from verl.model_merger.base_model_merger import ModelMergerConfig
from verl.model_merger.fsdp_model_merger import FSDPModelMerger

local_dir, target_dir = sys.argv[1:3]
os.makedirs(target_dir, exist_ok=True)
merger = FSDPModelMerger(ModelMergerConfig(
    operation="merge", backend="fsdp", local_dir=local_dir, target_dir=target_dir,
    hf_model_config_path=os.path.join(local_dir, "huggingface")))
world_size = merger._get_world_size()
mesh, names = merger._extract_device_mesh_info(merger._load_rank_zero_state_dict(world_size),
                                               world_size)
total_shards, mesh_shape = merger._calculate_shard_configuration(mesh, names)
state_dict = merger._load_and_merge_state_dicts(world_size, total_shards, mesh_shape, names)
if merger.save_lora_adapter(state_dict) is None:
    sys.exit(f"{local_dir}: no lora_ weights in the checkpoint")
"""


def _verl_lora_adapter(actor_dir: Path, out_dir: str | Path) -> None:
    command = [sys.executable, "-c", _LORA_ADAPTER_ONLY, str(actor_dir), str(out_dir)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"verl's model merger failed on the LoRA-only checkpoint "
                           f"{actor_dir}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def verify_conversion(actor_dir: str | Path, converted_dir: str | Path) -> dict[str, Any]:
    """verl's own check (``model_merger test``): the checkpoint's merged shards against the
    weights of the converted folder."""
    try:
        _verl_merger("test", "--local_dir", str(actor_dir), "--test_hf_dir", str(converted_dir))
    except RuntimeError as exc:
        return {"method": "verl.model_merger test", "passed": False, "error": str(exc)[-2000:]}
    return {"method": "verl.model_merger test", "passed": True}


def _verl_merger(operation: str, *args: str) -> None:
    command = [sys.executable, "-m", "verl.model_merger", operation, "--backend", "fsdp", *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"verl's model merger failed ({' '.join(command)}):\n"
                           f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
