"""verl FSDP checkpoints to Hugging Face folders, through verl's own model merger.

verl's merger runs on CPU. For full fine-tuning it writes the trained weights; for a LoRA
run, the base weights plus a ``lora_adapter/`` folder, which the LoRA merge then folds in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

LATEST = "latest_checkpointed_iteration.txt"


def latest_step(checkpoints: str | Path) -> int:
    """The step of the newest checkpoint verl recorded in ``checkpoints`` (its
    ``latest_checkpointed_iteration.txt``); 0 when there is none."""
    marker = Path(checkpoints) / LATEST
    return int(marker.read_text().strip()) if marker.is_file() else 0


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
    _verl_merger("merge", "--local_dir", str(actor_dir), "--target_dir", str(out_dir))
    return Path(out_dir)


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
