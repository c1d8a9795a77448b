"""The LoRA target check (models/facts.py) on a real model folder, with peft as the referee:
what the check passes, peft wraps; what it refuses, peft refuses too, with a traceback at the
first training step instead of a line in the preflight, or, for a misspelt name in a list,
skips without a word."""

from __future__ import annotations

import pytest
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from rl_pipeline.models.facts import lora_target_problem

LAYERS = "its linear layers: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"


def _peft_wraps(model_dir, target_modules) -> set[str]:
    """The names of the modules peft wraps for ``target_modules`` (a fresh model each time:
    get_peft_model wraps it in place); empty where peft refuses the target."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    try:
        wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=target_modules))
    except ValueError as exc:
        assert "not found in the base model" in str(exc)
        return set()
    return {name.rsplit(".", 2)[-2] for name, _ in wrapped.named_modules()
            if name.endswith(".lora_A")}


@pytest.mark.parametrize("target_modules", [
    ["q_proj", "v_proj"],
    r".*\.(q_proj|v_proj)",
    r"model\.layers\.0\..*_proj",
])
def test_a_target_peft_wraps_passes(tiny_model_dir, target_modules) -> None:
    assert lora_target_problem(str(tiny_model_dir), target_modules) is None
    assert _peft_wraps(tiny_model_dir, target_modules)


@pytest.mark.parametrize(("target_modules", "allowed"), [
    (["q_proj", "nope_proj"], "names of the model's modules: no module of {model} is named "
                              "'nope_proj'; " + LAYERS),
    # A list without its brackets is one regex to peft, which full-matches it against each
    # module's whole path: it matches nothing.
    ("q_proj, v_proj", "a list '[q_proj,v_proj]' or a regex that matches the whole path of a "
                       "module (peft's test, e.g. '.*\\.(q_proj|v_proj)'): 'q_proj, v_proj' "
                       "matches no module of {model} (a list of names is written in "
                       "brackets: '[q_proj,v_proj]'); " + LAYERS),
    ("q_proj", "a list '[q_proj,v_proj]' or a regex that matches the whole path of a module "
               "(peft's test, e.g. '.*\\.(q_proj|v_proj)'): 'q_proj' matches no module of "
               "{model} (a list of names is written in brackets: '[q_proj]'); " + LAYERS),
])
def test_a_target_peft_would_refuse_is_named_with_the_models_layers(
        tiny_model_dir, target_modules, allowed) -> None:
    model = str(tiny_model_dir)
    assert lora_target_problem(model, target_modules) == allowed.format(model=model) + \
        " (or all-linear)"
    # peft: the list's q_proj alone, nope_proj skipped silently; nothing for the others.
    assert _peft_wraps(tiny_model_dir, target_modules) == (
        {"q_proj"} if isinstance(target_modules, list) else set())


def test_a_target_that_is_no_regex_is_named(tiny_model_dir) -> None:
    problem = lora_target_problem(str(tiny_model_dir), "[q_proj")
    assert problem.startswith("a list '[q_proj,v_proj]' or a regex: '[q_proj' is not one "
                              "(unterminated")


def test_all_linear_and_a_model_not_yet_fetched_pass_unread(tmp_path, tiny_model_dir) -> None:
    assert lora_target_problem(str(tiny_model_dir), "all-linear") is None
    # A hub id, or a folder without safetensors: peft decides when the model is there.
    assert lora_target_problem("Qwen/Qwen2.5-0.5B-Instruct", ["nope_proj"]) is None
    assert lora_target_problem(str(tmp_path), ["nope_proj"]) is None


@pytest.mark.parametrize("target_modules", [
    ["q_proj", "lm_head"],  # the tiny model's head, tied to the embeddings
    ["q_proj", "embed_tokens"],
    r".*\.(q_proj)|lm_head",
])
def test_a_target_peft_wraps_but_the_merge_cannot_merge_is_refused(
        tiny_model_dir, tmp_path, target_modules) -> None:
    """peft trains these, then saves the head's base weights beside its factors (or the
    embeddings' factors as lora_embedding_A/B): merge refused the adapter after training."""
    from rl_pipeline.merge.lora import AdapterError, merge_lora, read_adapter
    from rl_pipeline.testing import train_tiny_lora

    problem = lora_target_problem(str(tiny_model_dir), target_modules)
    assert problem.startswith("linear layers of the model's blocks: LoRA on ")
    assert problem.endswith(LAYERS + " (or all-linear)")
    adapter = train_tiny_lora(tiny_model_dir, tmp_path / "adapter", steps=1,
                              target_modules=target_modules)
    with pytest.raises(AdapterError, match="not lora_A/lora_B factors"):
        merge_lora(tiny_model_dir, read_adapter(adapter), tmp_path / "merged")


def test_gpt2s_embeddings_are_found_by_kind_not_name(tmp_path) -> None:
    """GPT-2 names its embeddings wte and wpe: a name list missed them, and peft saved their
    LoRA as lora_embedding_A/B, which merge refuses."""
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(tmp_path)
    problem = lora_target_problem(str(tmp_path), ["c_attn", "wte"])
    assert problem.startswith("linear layers of the model's blocks: LoRA on wte cannot be ")
    assert problem.endswith("its linear layers: c_attn, c_fc, c_proj (or all-linear)")
    assert lora_target_problem(str(tmp_path), ["c_attn", "c_proj"]) is None
