"""The initial adapter that carries LoRA dropout into verl's actor, loaded the way verl's FSDP
engine loads it (``PeftModel.from_pretrained(..., is_trainable=True)``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM

from rl_pipeline.engines.verl.config import (
    TRAINER_SETTINGS,
    LaunchInputs,
    launch_overrides,
    spec_values,
)
from rl_pipeline.engines.verl.lora import initial_adapter_dir, write_initial_adapter
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams

VERL_ENGINE = "verl.workers.engine.fsdp.transformer_impl"


def _load_as_verl(model_dir: Path, adapter: Path) -> PeftModel:
    source = Path(__import__(VERL_ENGINE, fromlist=["x"]).__file__).read_text()
    # The call this test repeats; if verl changes it, so must lora.py.
    assert "PeftModel.from_pretrained(module, local_adapter_path, is_trainable=True)" in source
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    return PeftModel.from_pretrained(base, str(adapter), is_trainable=True)


def test_the_initial_adapter_trains_with_dropout_and_leaves_the_model_unchanged(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = write_initial_adapter(tmp_path / "adapter", str(tiny_model_dir), rank=8, alpha=16,
                                   dropout=0.05, target_modules="all-linear",
                                   exclude_modules=None, seed=3)
    model = _load_as_verl(tiny_model_dir, folder)
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert layers, "no LoRA layer"
    for layer in layers:
        assert layer.lora_dropout["default"].p == 0.05
        assert layer.scaling["default"] == 16 / 8
        assert torch.count_nonzero(layer.lora_B["default"].weight) == 0  # peft's init: B = 0
        assert torch.count_nonzero(layer.lora_A["default"].weight) > 0
        assert layer.lora_A["default"].weight.requires_grad
    ids = torch.tensor([[1, 5, 9, 2]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, base(ids).logits)
    # The same seed gives the same adapter; an existing one is kept (a resumed run).
    again = write_initial_adapter(tmp_path / "again", str(tiny_model_dir), 8, 16, 0.05,
                                  "all-linear", None, seed=3)
    assert (again / "adapter_model.safetensors").read_bytes() == \
        (folder / "adapter_model.safetensors").read_bytes()
    stamp = (folder / "adapter_model.safetensors").stat().st_mtime_ns
    write_initial_adapter(folder, str(tiny_model_dir), 8, 16, 0.2, "all-linear", None, 4)
    assert (folder / "adapter_model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_launch_starts_from_the_adapter_only_with_dropout(dropout: float, tmp_path: Path,
                                                          digit_reward_file: Path) -> None:
    inputs = LaunchInputs(train_files="t.parquet", val_files="v.parquet", model_path="m",
                          checkpoints_dir=str(tmp_path / "ckpt"), tracking_uri="sqlite:///x.db",
                          rollouts_per_step=4)
    reward = RewardParams(custom_reward_function={"path": str(digit_reward_file),
                                                  "name": "score"})
    values = {**spec_values(VerlParams(), DataParams()), "actor_model_lora_rank": 16,
              "actor_model_lora_dropout": dropout}
    out = launch_overrides(values, inputs, reward, critic=False, pip=[])
    adapter = [o for o in out if o.startswith("actor_rollout_ref.model.lora_adapter_path=")]
    settings = [o for o in out if o.startswith(f"+{TRAINER_SETTINGS}.lora_dropout=")]
    if dropout:
        assert adapter and str(initial_adapter_dir(tmp_path / "ckpt")) in adapter[0]
        assert settings == [f"+{TRAINER_SETTINGS}.lora_dropout=0.05"]
    else:
        assert not adapter and not settings
