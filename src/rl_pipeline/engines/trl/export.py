"""The trl engine's export: the newest ``checkpoint-N`` as a training result."""

from __future__ import annotations

import shutil
from pathlib import Path

from rl_pipeline.engines.base import TrainRun
from rl_pipeline.engines.trl.checkpoints import last_checkpoint
from rl_pipeline.runs.debris import work_dir
from rl_pipeline.training_result import TrainingResult

# Trainer state in a checkpoint folder: for resuming, not part of the trained model.
_TRAINER_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json",
                  "training_args.bin", "rng_state")


def export_result(run: TrainRun, scratch_dir: str | Path) -> Path:
    """The newest ``checkpoint-N`` as a training result: the adapter (``peft_adapter``) or,
    when ``apply_lora`` is false, the whole model (``hf_model``), with the tokenizer and
    without the trainer's state. The trainer always saves the last step, so this is the
    trained model."""
    last = last_checkpoint(run.checkpoints)
    if last is None:
        raise RuntimeError(f"the trl run left no checkpoint in {run.checkpoints}")
    Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    out = work_dir("training-result", scratch_dir)
    try:
        for item in Path(last).iterdir():
            if item.is_file() and not item.name.startswith(_TRAINER_STATE):
                shutil.copy2(item, out / item.name)
        kind = "peft_adapter" if run.summary["lora"] else "hf_model"
        TrainingResult(kind=kind, engine="trl", run=run.summary, source=str(last)).write(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out
