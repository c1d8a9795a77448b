"""LoRA dropout for verl's actor, through verl's own way of starting from an adapter.

verl 0.9.1's FSDP engine builds its ``LoraConfig`` from rank, alpha and the target modules
only, so its adapters train without dropout; TRL's (peft's) take ``lora_dropout``. On the
CPU run the two engines learned differently because of it (docs/benchmarks.md: TRL with
dropout 0.05 reached 0.625-0.65 strict accuracy, without it 0.54). verl does let a run start
from an adapter (``actor_rollout_ref.model.lora_adapter_path``, loaded with peft's
``PeftModel.from_pretrained``, whose config, dropout included, then governs training). So with
``train.verl.actor_model_lora_dropout`` above 0 the run starts from an adapter this module
writes: peft's own initialisation (A random, B zero: the model unchanged) with verl's rank,
alpha, targets and exclusions, and the dropout. The base model is built on the meta device,
so no weight is read: a 7B model's adapter takes as long as a 135M one's.

verl computes the old log-probabilities in eval mode (no dropout), as the rollout samples;
only the update's forward drops out, as TRL's does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

INITIAL_ADAPTER = "initial_lora_adapter"


def initial_adapter_dir(checkpoints_dir: str | Path) -> Path:
    """Where a run's initial adapter lives: beside its checkpoints (shared storage on a
    cluster, where verl's workers read it)."""
    return Path(checkpoints_dir) / INITIAL_ADAPTER


def write_initial_adapter(folder: Path, model_path: str, rank: int, alpha: int,
                          dropout: float, target_modules: Any, exclude_modules: Any,
                          seed: int) -> Path:
    """A freshly initialised LoRA adapter for ``model_path`` in ``folder`` (written whole or
    not at all; an existing one is kept, so a resumed run starts as it did)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_pipeline.runs.staging import staged

    if (folder / "adapter_config.json").is_file():
        return folder
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    peft_model = get_peft_model(model, LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=_plain(target_modules),
        exclude_modules=_plain(exclude_modules), bias="none", task_type="CAUSAL_LM"))
    torch.manual_seed(seed)
    for module in peft_model.modules():
        if isinstance(module, LoraLayer):
            for name in module.lora_A:
                module.lora_A[name].to_empty(device="cpu")
                module.lora_B[name].to_empty(device="cpu")
                module.reset_lora_parameters(name, init_lora_weights=True)
    with staged(folder) as staging:
        peft_model.save_pretrained(str(staging))
    return folder


def _plain(value: Any) -> Any:
    """A Hydra list or string as peft takes it."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]
