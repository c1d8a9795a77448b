"""Boundary: verl's FSDP checkpoint of a LoRA actor -> our adapter export -> our merge.

verl 0.9.1's trainer saves the actor through ``FSDPCheckpointManager.save_checkpoint``
(verl/workers/engine/fsdp/transformer_impl.py:871-890); the pipeline exports the adapter
from the newest such checkpoint (``export_result``: ``python -m verl.model_merger merge``,
then its ``lora_adapter/``) and the merge stage folds it into the base model.

Here the checkpoint is written by verl's own code on CPU, not by hand: a single-process gloo
group (world size 1), the peft LoRA model built as verl's FSDP engine builds it, wrapped by
verl's ``apply_fsdp2`` (FSDP2 ``fully_shard``) on a CPU device mesh, a few optimizer steps,
then ``FSDPCheckpointManager(...).save_checkpoint``. The one verl helper of that path that
cannot run on CPU is ``fsdp2_load_full_state_dict``: it moves the model to
``get_device_id()`` (verl/utils/fsdp_utils.py:506-509); without an accelerator verl's
platform falls back to CUDA (verl/plugin/platform/platform_manager.py:113-114), so that is
``torch.cuda.current_device()`` (platform_cuda.py:72-73), which raises. The helper only
copies the loaded weights into the sharded parameters, and ``fully_shard`` of a model whose
weights are already real keeps them, so it is left out.

Both of verl's LoRA layouts are covered: the default (the whole peft model's state dict:
base weights and factors) and ``checkpoint.save_lora_only`` (the factors alone), which
verl's merger cannot convert (it fails on the base model it has no weights for), so
``convert_fsdp_checkpoint`` extracts only the adapter from it.

The merged model's logits are checked against base + the trained adapter computed by peft
independently of the pipeline: the adapter weights taken from the live trained model, not
from any file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.gpu_boundary.verl_actor import (
    ALPHA,
    RANK,
    fsdp2,
    lora_actor,
    single_process_group,
)

pytestmark = pytest.mark.gpu_boundary

STEP = 2
PROBES = ["Natalia sold clips to 48 of her friends.", "2 + 2 =", "Write a haiku."]


def _train_and_checkpoint(model_dir: Path, tokenizer, checkpoints: Path,
                          lora_only: bool) -> dict[str, torch.Tensor]:
    """Train a LoRA actor a few steps under FSDP2 and save it with verl's checkpoint manager,
    at step 1 (untrained: lora_B is still zero) and step ``STEP``.

    Returns:
        The trained LoRA factors (full tensors), by their FSDP state-dict names.
    """
    from verl.trainer.config import CheckpointConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import fsdp_version
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    torch.manual_seed(0)
    actor = lora_actor(model_dir)
    fsdp2(actor)
    assert fsdp_version(actor) == 2
    # torch.optim.AdamW over module.parameters() is what verl's build_optimizer makes by
    # default (verl/workers/config/optimizer.py:298); a large lr so the adapter moves.
    optimizer = torch.optim.AdamW(actor.parameters(), lr=5e-2, weight_decay=0.01)
    scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=0)
    # The actor's checkpoint config as verl's actor.yaml gives it (model, optimizer, extra; no
    # hf_model), with or without save_lora_only (an override: the factors alone,
    # fsdp_checkpoint_manager.py:322-347). The manager itself runs on CPU as it is: it asks
    # for no device id, and its RNG state skips the absent accelerator.
    manager = FSDPCheckpointManager(model=actor, optimizer=optimizer, lr_scheduler=scheduler,
                                    processing_class=tokenizer,
                                    checkpoint_config=CheckpointConfig(save_lora_only=lora_only))

    def save(step: int) -> None:
        # ray_trainer.py:983-1050 (_save_checkpoint): global_step_N/actor through the worker,
        # the dataloader state beside it, then the tracker file.
        step_dir = checkpoints / f"global_step_{step}"
        manager.save_checkpoint(local_path=str(step_dir / "actor"), global_step=step)
        # A stand-in for the dataloader's state (no dataloader here; nothing downstream reads it).
        torch.save({"_num_yielded": step}, step_dir / "data.pt")
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))

    save(1)  # a stale checkpoint whose adapter is a no-op: the export must take the newest
    ids = torch.randint(0, len(tokenizer), (4, 24))
    for _ in range(3):
        actor(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    save(STEP)
    return {name: param.full_tensor().detach().clone()
            for name, param in actor.named_parameters() if "lora_" in name}


def _reference_model(model_dir: Path, lora: dict[str, torch.Tensor]):
    """base + adapter by peft alone: a fresh LoRA model given the trained factors, merged."""
    model = lora_actor(model_dir)
    result = model.load_state_dict(lora, strict=False)
    assert not result.unexpected_keys
    assert not [k for k in result.missing_keys if "lora_" in k]
    return model.merge_and_unload().eval()


def _logits(model, tokenizer) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(input_ids=tokenizer(text, return_tensors="pt")["input_ids"]).logits.float()
                for text in PROBES]


# verl's import notes its optional engines; peft notes that ".*visual.*" (our default
# exclude_modules, for vision models) matches nothing in a text model.
@pytest.mark.filterwarnings("ignore:.* engine is not available:UserWarning",
                            "ignore:You have passed exclude_modules:UserWarning")
@pytest.mark.parametrize("lora_only", [False, True], ids=["full_state", "save_lora_only"])
def test_verl_lora_checkpoint_exports_and_merges_to_base_plus_adapter(
        tiny_model_dir, tokenizer, tmp_path, lora_only) -> None:
    from transformers import AutoModelForCausalLM

    from rl_pipeline.engines.verl.checkpoint import export_result
    from rl_pipeline.params import MergeParams
    from rl_pipeline.params.model_registry import RegistryParams
    from rl_pipeline.pipelines.merge.nodes import merge_model

    checkpoints = tmp_path / "checkpoints"
    with single_process_group(tmp_path):
        lora = _train_and_checkpoint(tiny_model_dir, tokenizer, checkpoints, lora_only)
    assert any(k for k, v in lora.items() if "lora_B" in k and v.abs().max() > 0)

    # The layout verl wrote (fsdp_checkpoint_manager.py:316-318 shards, 373-392 huggingface/,
    # 410-416 fsdp_config.json, 417 lora_train_meta.json), read the way its merger reads it.
    actor = checkpoints / f"global_step_{STEP}" / "actor"
    assert sorted(p.relative_to(actor).as_posix() for p in actor.rglob("*")) == sorted([
        "extra_state_world_size_1_rank_0.pt", "fsdp_config.json", "huggingface",
        "huggingface/chat_template.jinja", "huggingface/config.json",
        "huggingface/generation_config.json", "huggingface/tokenizer.json",
        "huggingface/tokenizer_config.json", "lora_train_meta.json",
        "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt"])
    assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 2,
                                                                    "world_size": 1}
    assert json.loads((actor / "lora_train_meta.json").read_text()) == {
        "r": RANK, "lora_alpha": ALPHA, "task_type": "CAUSAL_LM"}
    shard = torch.load(actor / "model_world_size_1_rank_0.pt", weights_only=False)
    # The peft-wrapped FSDP2 model's own names, as DTensors: base weights under base_layer,
    # factors under the adapter name "default" (verl's merger strips both).
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in shard
    assert ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
            in shard) is not lora_only
    assert {type(v).__name__ for v in shard.values()} == {"DTensor"}
    assert set(lora) == {k for k in shard if "lora_" in k}
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == str(STEP)

    record = export_result(checkpoints, tmp_path / "scratch", {"mlflow_run_id": "r1"})
    config = json.loads((record / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"}
    result = json.loads((record / "training_result.json").read_text())
    assert (result["kind"], result["source"]) == ("peft_adapter", str(actor))

    path, metadata, _ = merge_model(str(record), str(tiny_model_dir), str(tmp_path / "scratch"),
                                    MergeParams(), RegistryParams())
    assert metadata["verification"]["passed"] is True
    assert metadata["merged_modules"] == 2 * 7  # two layers, seven linear modules each
    assert metadata["lora"]["r"] == RANK and metadata["lora"]["lora_alpha"] == ALPHA
    assert metadata["training_run"]["mlflow_run_id"] == "r1"
    assert json.loads((Path(path) / "merge_metadata.json").read_text()) == metadata

    merged = _logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
                     tokenizer)
    reference = _logits(_reference_model(tiny_model_dir, lora), tokenizer)
    base = _logits(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir),
                                                        dtype=torch.float32).eval(), tokenizer)
    effect = max(float((r - b).abs().max()) for r, b in zip(reference, base, strict=True))
    diff = max(float((m - r).abs().max()) for m, r in zip(merged, reference, strict=True))
    # verl's merger stores the factors in bfloat16 (fsdp_model_merger.py:187), so the merged
    # delta carries their rounding (8 mantissa bits, about 0.5% of the adapter's effect
    # here); a no-op adapter, a stale checkpoint or a wrong scale (alpha/r) is off by far more.
    assert effect > 0.1, f"the trained adapter barely changes the logits ({effect:.3g})"
    assert diff <= 0.02 * effect, f"merged vs base+adapter: {diff:.3g} (effect {effect:.3g})"
