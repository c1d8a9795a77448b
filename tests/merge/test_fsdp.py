"""Full fine-tuning: a verl FSDP checkpoint converted by verl's own model merger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_pipeline.config import MergeParams
from rl_pipeline.pipelines.merge.nodes import merge_model


def _verl_checkpoint(model_dir: Path, root: Path, step: int = 3) -> tuple[Path, dict]:
    """A single-GPU (world size 1) checkpoint in verl's layout, with changed weights."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    with torch.no_grad():  # "training": parameters, so tied embeddings stay tied
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, actor / "huggingface" / f.name)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    (root / "training_run.json").write_text(json.dumps({"mlflow_run_id": "abc123"}))
    return actor, state


def test_full_fine_tuning_checkpoint_is_converted_and_verified(tiny_model_dir, tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    actor, state = _verl_checkpoint(tiny_model_dir, checkpoints)
    path, metadata, metrics = merge_model(None, str(checkpoints), str(tiny_model_dir),
                                          MergeParams(scratch_dir=str(tmp_path / "scratch")))
    merged = AutoModelForCausalLM.from_pretrained(path)
    for key, value in merged.state_dict().items():
        assert value.dtype == torch.bfloat16  # verl's merger saves bfloat16
        assert torch.equal(value, state[key].to(torch.bfloat16)), key
    assert metadata["checkpoint"] == str(actor) and metadata["dtype"] == "bfloat16"
    assert metadata["verification"] == {"method": "verl.model_merger test", "passed": True}
    assert metadata["training_run"] == {"mlflow_run_id": "abc123"}
    assert (Path(path) / "merge_metadata.json").is_file()
    assert not list((tmp_path / "scratch").glob(".convert-*"))


def test_nothing_to_merge_says_so(tiny_model_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_model(None, str(tmp_path / "no_checkpoints"), str(tiny_model_dir), MergeParams())


def test_a_full_fine_tuning_record_in_lora_adapter_merges_the_checkpoint(tiny_model_dir,
                                                                         tmp_path) -> None:
    from rl_pipeline.engines.verl_engine import export_adapter

    checkpoints = tmp_path / "checkpoints"
    actor, state = _verl_checkpoint(tiny_model_dir, checkpoints)
    record = export_adapter(checkpoints, tmp_path / "scratch", {"mlflow_run_id": "r1"},
                            lora=False)
    path, metadata, _ = merge_model(str(record), str(checkpoints), str(tiny_model_dir),
                                    MergeParams(scratch_dir=str(tmp_path / "scratch")))
    assert metadata["checkpoint"] == str(actor) and metadata["adapter"] is None
    assert metadata["training_run"]["mlflow_run_id"] == "r1"
    merged = AutoModelForCausalLM.from_pretrained(path)
    key = next(iter(state))
    assert torch.equal(merged.state_dict()[key], state[key].to(torch.bfloat16))
