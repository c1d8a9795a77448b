"""The streaming LoRA merge: equal to base + adapter through peft, and refusing bad adapters."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rl_pipeline.merge.lora import AdapterError, merge_lora, read_adapter
from rl_pipeline.merge.verify import verify_merge
from rl_pipeline.testing import train_tiny_lora

IDS = torch.tensor([[3, 17, 42, 99, 7, 250, 12]])


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return train_tiny_lora(tiny_model_dir, tmp_path_factory.mktemp("adapter"))


def _peft_logits(base: Path, adapter: Path, dtype=torch.float32) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    with torch.inference_mode():
        return PeftModel.from_pretrained(model, str(adapter))(IDS).logits.float()


def _logits(folder: Path, dtype=torch.float32) -> torch.Tensor:
    with torch.inference_mode():
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)(IDS).logits.float()


@pytest.mark.slow
def test_merged_model_equals_base_plus_adapter(tiny_model_dir, adapter_dir, tmp_path) -> None:
    summary = merge_lora(tiny_model_dir, read_adapter(adapter_dir), tmp_path / "merged")
    assert summary["merged_modules"] == 2 * 7  # 2 layers x q,k,v,o,gate,up,down
    merged = _logits(tmp_path / "merged")
    reference = _peft_logits(tiny_model_dir, adapter_dir)
    assert torch.allclose(merged, reference, atol=1e-4)
    assert (merged - _logits(tiny_model_dir)).abs().max() > 1e-2  # the adapter did something
    result = verify_merge(tiny_model_dir, adapter_dir, tmp_path / "merged")
    assert result["passed"] and result["max_abs_diff"] < 1e-4


@pytest.mark.slow
def test_sharded_bfloat16_base(tiny_model_dir, adapter_dir, tmp_path) -> None:
    base = tmp_path / "bf16_sharded"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    model.save_pretrained(str(base), max_shard_size="50KB")
    for f in tiny_model_dir.glob("tokenizer*"):
        shutil.copy(f, base)
    assert len(list(base.glob("model-*.safetensors"))) > 2
    merge_lora(base, read_adapter(adapter_dir), tmp_path / "merged", dtype=torch.bfloat16)
    assert len(list((tmp_path / "merged").glob("model-*.safetensors"))) == len(
        list(base.glob("model-*.safetensors")))
    assert json.loads((tmp_path / "merged/config.json").read_text())["dtype"] == "bfloat16"
    result = verify_merge(base, adapter_dir, tmp_path / "merged", dtype=torch.bfloat16)
    assert result["passed"], result


def test_a_wrong_merge_fails_verification(tiny_model_dir, adapter_dir, tmp_path) -> None:
    adapter = read_adapter(adapter_dir)
    adapter.alpha *= 3  # as if lora_alpha were misread
    merge_lora(tiny_model_dir, adapter, tmp_path / "wrong")
    result = verify_merge(tiny_model_dir, adapter_dir, tmp_path / "wrong")
    assert not result["passed"] and result["max_abs_diff"] > result["tolerance"]


@pytest.mark.parametrize("alpha", [0, None])
def test_zero_or_missing_alpha_is_refused(adapter_dir, tmp_path, alpha) -> None:
    broken = tmp_path / "adapter"
    shutil.copytree(adapter_dir, broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    if alpha is None:
        del config["lora_alpha"]
    else:
        config["lora_alpha"] = alpha
    (broken / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="lora_alpha=.*merge as a no-op"):
        read_adapter(broken)


def test_adapter_for_another_model_is_refused(tiny_model_dir, tokenizer, tmp_path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    wider = Qwen2Config(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=160,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    Qwen2ForCausalLM(wider).save_pretrained(str(tmp_path / "other"))
    adapter = train_tiny_lora(tmp_path / "other", tmp_path / "other_adapter", steps=1)
    with pytest.raises(AdapterError, match="(?s)does not fit the base model.*shape mismatch"):
        merge_lora(tiny_model_dir, read_adapter(adapter), tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


@pytest.mark.slow
def test_target_modules_list_and_regex(tiny_model_dir, tmp_path) -> None:
    for name, targets in (("list", ["q_proj", "v_proj"]), ("regex", r".*\.(up|down)_proj")):
        adapter = train_tiny_lora(tiny_model_dir, tmp_path / name, target_modules=targets)
        summary = merge_lora(tiny_model_dir, read_adapter(adapter), tmp_path / f"m_{name}")
        assert summary["merged_modules"] == 4
        assert verify_merge(tiny_model_dir, adapter, tmp_path / f"m_{name}")["passed"]


@pytest.mark.parametrize(("name", "lora"), [
    ("rslora", {"use_rslora": True}),  # scale alpha / sqrt(r), not alpha / r
    ("patterns", {"rank_pattern": {"q_proj": 4}, "alpha_pattern": {"v_proj": 64}}),
    # Keys with alternatives: peft groups them, '(.*\.)?(q_proj|v_proj)$'; ungrouped, the
    # alternative split the regex and v_proj and o_proj took the default scale.
    ("alternatives", {"rank_pattern": {"q_proj|v_proj": 4},
                      "alpha_pattern": {"k_proj|o_proj": 64}}),
])
def test_rslora_and_per_module_rank_and_alpha_merge_as_peft_applies_them(
        tiny_model_dir, tmp_path, name, lora) -> None:
    adapter = train_tiny_lora(tiny_model_dir, tmp_path / name, **lora)
    read = read_adapter(adapter)
    merge_lora(tiny_model_dir, read, tmp_path / "merged")
    assert torch.allclose(_logits(tmp_path / "merged"), _peft_logits(tiny_model_dir, adapter),
                          atol=1e-4)
    assert verify_merge(tiny_model_dir, adapter, tmp_path / "merged")["passed"]
    # The setting matters: merged as plain LoRA, the model is another one.
    plain = dataclasses.replace(read, use_rslora=False, rank_pattern={}, alpha_pattern={})
    merge_lora(tiny_model_dir, plain, tmp_path / "plain")
    assert not verify_merge(tiny_model_dir, adapter, tmp_path / "plain")["passed"]


def test_a_float16_merge_is_within_float16s_rounding(tiny_model_dir, adapter_dir,
                                                     tmp_path) -> None:
    merge_lora(tiny_model_dir, read_adapter(adapter_dir), tmp_path / "merged",
               dtype=torch.float16)
    assert json.loads((tmp_path / "merged/config.json").read_text())["dtype"] == "float16"
    result = verify_merge(tiny_model_dir, adapter_dir, tmp_path / "merged", dtype=torch.float16)
    assert result["passed"], result
    # Rounded to float16 (the rounding moved the logits), as peft's merge rounds: equal.
    assert result["dtype"] == "float16" and result["rounding_share"] > 0
    assert result["max_abs_diff"] <= result["tolerance"]


def test_gpt2s_conv1d_layers_merge_transposed_as_peft_merges_them(tmp_path) -> None:
    """GPT-2 keeps its attention and MLP weights as (in, out) (Conv1D; peft's
    fan_in_fan_out): the delta B @ A goes in transposed. c_attn (16 -> 48) did not fit
    untransposed; c_proj (16 -> 16) fitted and merged wrong."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1,
                                      n_head=2))
    base.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, fan_in_fan_out=True,
                                                 target_modules=["c_attn", "c_proj"]))
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:  # as if trained: B leaves its zero initialisation
            torch.nn.init.normal_(parameter, std=0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = peft_model.merge_and_unload().state_dict()

    summary = merge_lora(tmp_path / "base", read_adapter(tmp_path / "adapter"),
                         tmp_path / "merged")
    assert summary["merged_modules"] == 3  # attn.c_attn, attn.c_proj, mlp.c_proj
    merged = GPT2LMHeadModel.from_pretrained(str(tmp_path / "merged")).state_dict()
    before = GPT2LMHeadModel.from_pretrained(str(tmp_path / "base")).state_dict()
    for key in ("transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight",
                "transformer.h.0.mlp.c_proj.weight"):
        assert torch.allclose(merged[key], expected[key], atol=1e-5), key
        assert not torch.allclose(merged[key], before[key], atol=1e-3), key


def test_a_bfloat16_merge_at_another_scale_fails_however_small_the_adapter(
        tiny_model_dir, adapter_dir, tmp_path) -> None:
    """Compared in bfloat16, the two computations' rounding (4% of the largest logit) was more
    than a small adapter's whole effect: a merge at twice or half the scale, or none at all,
    passed. Compared in float32 with peft's merge rounded to bfloat16, each fails."""
    from safetensors.torch import load_file, save_file

    base = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16) \
        .save_pretrained(str(base))
    for f in tiny_model_dir.glob("tokenizer*"):
        shutil.copy(f, base)
    factors = load_file(adapter_dir / "adapter_model.safetensors")
    for shrink in (1e-3, 1.0):  # a thousandth of the trained change, and all of it
        adapter_path = tmp_path / f"adapter{shrink}"
        shutil.copytree(adapter_dir, adapter_path)
        save_file({k: t * shrink if "lora_B" in k else t for k, t in factors.items()},
                  adapter_path / "adapter_model.safetensors", metadata={"format": "pt"})
        adapter = read_adapter(adapter_path)
        results = {}
        for name, factor in (("right", 1.0), ("twice", 2.0), ("half", 0.5), ("none", 1e-9)):
            out = tmp_path / f"{name}{shrink}"
            merge_lora(base, dataclasses.replace(adapter, alpha=adapter.alpha * factor), out,
                       dtype=torch.bfloat16)
            results[name] = verify_merge(base, adapter_path, out, dtype=torch.bfloat16)
        right = results["right"]
        assert right["passed"] and right["compared_in"] == "float32", right
        if shrink < 1:  # the whole effect within what the old check let through
            assert right["adapter_effect"] < 0.04 * right["max_abs_logit"]
        for name in ("twice", "half", "none"):
            assert not results[name]["passed"], (shrink, name, results[name])
