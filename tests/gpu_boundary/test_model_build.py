"""Boundary: verl's FSDP engine building our actor (and reference) model from our composed config.

verl builds the actor and the reference model in ``FSDPEngine._build_module``
(verl/workers/engine/fsdp/transformer_impl.py) with ``from_pretrained(config=hf_config)``, and
``HFModelConfig`` (verl/workers/config/model.py) takes the attention kernel of ``hf_config`` from
``model.override_config.attn_implementation``, flash_attention_2 when it is unset. Our config sets
it from ``train.verl.actor_model_attn_implementation`` (sdpa by default). These tests run verl's
own code on our composed config, on a CPU:

* the engine is the class verl's worker gets from ``EngineRegistry``, made by its real
  ``__init__`` (in a one-process gloo group); ``_build_module`` loads the model and
  ``_build_lora_module`` wraps it. Only the FSDP wrapping is left out: it needs an accelerator.
* without our override, verl's default flash_attention_2 fails where flash-attn is missing.
* with ``use_remove_padding`` (verl's default: the micro-batch packed into one row, no attention
  mask, position ids restarting at 0 for each sequence), verl's own input and output preparation
  gives each sequence the logits and log-probs it has alone: the packed sequences do not attend
  to each other under sdpa (transformers derives a block-causal mask from the position ids).
* the builds run verl's whole path with the trl we pin (1.12.0): verl 0.9.1's monkey patch
  imports trl's ``AutoModelForCausalLMWithValueHead`` whenever trl is installed, a class that
  trl 1.13+ no longer has (``test_verl_model_build_imports_the_pinned_trl``).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
import torch.distributed as dist
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict

from rl_pipeline.engines.verl.config import compose_verl_config, hydra_overrides, spec_values
from rl_pipeline.params import DataParams
from rl_pipeline.params.verl import VerlParams

if TYPE_CHECKING:  # verl's import takes seconds: at collection, only for the annotations
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

# verl's build imports trl.experimental, which warns at its import (once a process) unless told.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

pytestmark = pytest.mark.gpu_boundary

# Three sequences of different lengths, so that a leak between them would show.
PROMPT_LENGTHS = (5, 9, 3)
RESPONSE_LENGTHS = (4, 2, 7)
ATOL = 1e-4  # fp32 on a CPU: packed and alone differ by rounding only (about 1e-7)


@functools.cache
def _composed(model_dir: Path, attn_implementation: str) -> DictConfig:
    values = spec_values(VerlParams(actor_model_attn_implementation=attn_implementation),
                         DataParams())
    return compose_verl_config(
        hydra_overrides(values, [f"actor_rollout_ref.model.path={model_dir}"]))


def _verl_config(model_dir: Path, attn_implementation: str = "sdpa") -> DictConfig:
    """Our composed verl config for ``model_dir`` (``train.verl`` defaults but the attention
    kernel). Composing takes most of a second, so each is composed once and copied."""
    return copy.deepcopy(_composed(model_dir, attn_implementation))


def _actor_engine(config: DictConfig) -> FSDPEngineWithLMHead:
    """The actor's engine, made from ``config`` the way verl's workers make it.

    ``ActorRolloutRefWorker.init_model`` (verl/workers/engine_workers.py) turns the model and
    actor sections into dataclasses; ``TrainingWorker.__init__`` copies the model's packing and
    fused-kernel switches onto the engine config and asks ``EngineRegistry`` for the engine. The
    reference model gets a copy of the same ``HFModelConfig``, so it is built alike.
    """
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine import EngineRegistry

    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    engine_config = actor_config.engine
    engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
    engine_config.use_fused_kernels = model_config.get("use_fused_kernels", False)
    model_config.model_type = "language_model"
    return EngineRegistry.new(model_type="language_model", backend=engine_config.strategy,
                              model_config=model_config, engine_config=engine_config,
                              optimizer_config=actor_config.optim,
                              checkpoint_config=actor_config.checkpoint)


@pytest.fixture(scope="module")
def process_group() -> Iterator[None]:
    """A one-process gloo group: ``FSDPEngine.__init__`` reads its rank and builds its device
    mesh from it (the mesh is not used to load a model with tied embeddings, like ours)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def engine(tiny_model_dir: Path, process_group: None) -> FSDPEngineWithLMHead:
    """The actor engine for our default config (sdpa, packing, LoRA rank 64)."""
    return _actor_engine(_verl_config(tiny_model_dir))


def _rollout_micro_batch(vocab_size: int, use_remove_padding: bool,
                         seed: int = 0) -> tuple[TensorDict, list[torch.Tensor]]:
    """Three sequences as verl's trainer holds them after a rollout (prompts left-padded,
    responses right-padded, position ids from the mask), turned into the engine's no-padding
    micro-batch (nested input_ids and position_ids) by verl's own ``left_right_2_no_padding``;
    also the sequences themselves."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.model import compute_position_id_with_mask
    from verl.workers.utils.padding import left_right_2_no_padding

    generator = torch.Generator().manual_seed(seed)
    prompt_len, response_len = max(PROMPT_LENGTHS), max(RESPONSE_LENGTHS)
    batch = len(PROMPT_LENGTHS)
    input_ids = torch.zeros(batch, prompt_len + response_len, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(batch, response_len, dtype=torch.long)
    sequences = []
    for i, (p, r) in enumerate(zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True)):
        tokens = torch.randint(3, vocab_size, (p + r,), generator=generator)
        sequences.append(tokens)
        input_ids[i, prompt_len - p:prompt_len + r] = tokens
        attention_mask[i, prompt_len - p:prompt_len + r] = 1
        response_mask[i, :r] = 1
    data = TensorDict({"input_ids": input_ids, "attention_mask": attention_mask,
                       "response_mask": response_mask,
                       "position_ids": compute_position_id_with_mask(attention_mask)},
                      batch_size=batch)
    micro_batch = left_right_2_no_padding(data)
    # What the trainer's meta_info and the worker's defaults add (rollout temperature 1.0).
    tu.assign_non_tensor(micro_batch, temperature=1.0, use_remove_padding=use_remove_padding)
    return micro_batch, sequences


def _engine_forward(engine: FSDPEngineWithLMHead, module: torch.nn.Module,
                    micro_batch: TensorDict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``FSDPEngineWithLMHead.forward_step`` without its move to the accelerator (verl's device
    lookup asserts CUDA) and its autocast (fp32 here): verl's input preparation, the module call
    as verl makes it, verl's output preparation. Returns the logits as the model gave them
    (one packed row: (total tokens, vocab)) and each sequence's log-probs."""
    inputs, output_args = engine.prepare_model_inputs(micro_batch)
    with torch.no_grad():
        output = module(**inputs, use_cache=False)
        logits = output.logits.squeeze(0).clone()  # before verl's output steps touch them
        model_output = engine.prepare_model_outputs(output, output_args, micro_batch, None)
    return logits, list(model_output["log_probs"].unbind())


def _alone(module: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of one sequence run by itself: one row, no padding, no mask."""
    with torch.no_grad():
        return module(input_ids=tokens[None], use_cache=False).logits[0]


def test_actor_model_builds_with_sdpa_on_cpu(engine: FSDPEngineWithLMHead) -> None:
    from peft import PeftModel
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    assert isinstance(engine, FSDPEngineWithLMHead)
    hf_config = engine.model_config.hf_config
    assert hf_config._attn_implementation == "sdpa"
    # Tied embeddings make _build_module load on the CPU of every rank (no meta tensors).
    assert hf_config.tie_word_embeddings

    module = engine._build_module()
    assert module.config._attn_implementation == "sdpa"
    assert next(module.parameters()).dtype == torch.float32  # model_dtype fp32 for training
    tokens = torch.arange(3, 19)[None]
    with torch.no_grad():
        before = module(input_ids=tokens, use_cache=False).logits
    assert before.shape == (1, 16, hf_config.vocab_size) and torch.isfinite(before).all()

    # LoRA as the engine applies it for lora_rank > 0 (our default 64, all-linear).
    assert engine._is_lora
    lora = engine._build_lora_module(module)
    assert isinstance(lora, PeftModel)
    assert lora.peft_config["default"].r == 64
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    with torch.no_grad():
        after = lora(input_ids=tokens, use_cache=False).logits
    # lora_B starts at zero: the wrapped model computes what the base model did.
    torch.testing.assert_close(after, before, atol=1e-6, rtol=0)
    # A training step's backward reaches the adapters (with verl's gradient checkpointing).
    lora.train()
    lora(input_ids=tokens, use_cache=False).logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in lora.parameters() if p.requires_grad)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None
                    or importlib.util.find_spec("kernels") is not None,
                    reason="flash-attn (or transformers' hub-kernel fallback) is installed")
def test_verl_default_flash_attention_2_fails_without_flash_attn(
        tiny_model_dir: Path, process_group: None) -> None:
    config = _verl_config(tiny_model_dir)
    # The config as it was before our parameter: verl's own override_config, empty.
    with open_dict(config):
        del config.actor_rollout_ref.model.override_config["attn_implementation"]
    engine = _actor_engine(config)
    assert engine.model_config.hf_config._attn_implementation == "flash_attention_2"
    # transformers refuses in from_pretrained, before verl's monkey patch (trl plays no part).
    with pytest.raises(ImportError, match="FlashAttention2 .* doesn't seem to be installed"):
        engine._build_module()


@pytest.mark.parametrize(("attn_implementation", "lora"),
                         [("sdpa", False), ("sdpa", True), ("eager", False)])
def test_packed_sequences_match_each_sequence_alone(
        tiny_model_dir: Path, process_group: None, attn_implementation: str,
        lora: bool) -> None:
    engine = _actor_engine(_verl_config(tiny_model_dir, attn_implementation))
    assert engine.use_remove_padding  # our default, as verl's
    module = engine._build_module()
    if lora:  # the actor as trained: PEFT must hand the position ids through
        module = engine._build_lora_module(module)
    module.eval()
    micro_batch, sequences = _rollout_micro_batch(module.config.vocab_size,
                                                  engine.use_remove_padding)
    logits, log_probs = _engine_forward(engine, module, micro_batch)
    offsets = micro_batch["input_ids"].offsets().tolist()
    assert logits.shape[0] == offsets[-1] == sum(PROMPT_LENGTHS) + sum(RESPONSE_LENGTHS)
    for i, tokens in enumerate(sequences):
        alone = _alone(module, tokens)
        torch.testing.assert_close(logits[offsets[i]:offsets[i + 1]], alone, atol=ATOL, rtol=0)
        # Log-prob of each next token; the last position's label is the next sequence's first
        # token (verl rolls the packed row), which verl never reads.
        expected = torch.log_softmax(alone, -1)[:-1].gather(-1, tokens[1:, None])[:, 0]
        torch.testing.assert_close(log_probs[i][:-1], expected, atol=ATOL, rtol=0)


def test_packed_comparison_sees_a_leak_between_sequences(
        engine: FSDPEngineWithLMHead) -> None:
    """Control: with position ids that do not restart, the same packed row lets the later
    sequences attend to the earlier ones, and the comparison above would catch it."""
    module = engine._build_module().eval()
    micro_batch, sequences = _rollout_micro_batch(module.config.vocab_size, True)
    inputs, _ = engine.prepare_model_inputs(micro_batch)
    positions = torch.arange(inputs["input_ids"].shape[1])[None]
    with torch.no_grad():
        logits = module(input_ids=inputs["input_ids"], position_ids=positions,
                        use_cache=False).logits[0]
    offsets = micro_batch["input_ids"].offsets().tolist()
    diffs = [(logits[offsets[i]:offsets[i + 1]] - _alone(module, tokens)).abs().max().item()
             for i, tokens in enumerate(sequences)]
    assert diffs[0] < ATOL  # the first sequence has nothing before it
    assert min(diffs[1:]) > 100 * ATOL


def test_verl_model_build_imports_the_pinned_trl(engine: FSDPEngineWithLMHead,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's model build with the trl we pin, and verl's monkey patch reaching trl.

    ``apply_monkey_patch`` (verl/models/transformers/monkey_patch.py, which ``_build_module``
    calls) imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo``, else from
    ``trl``, whenever trl is installed, and replaces the value-head class's ``state_dict`` with
    one that calls ``torch.nn.Module.state_dict``. trl 1.13+ removed the class from both places,
    and every verl model build then raises ImportError: this is why pyproject pins trl==1.12.0.
    """
    from verl.utils.import_utils import is_trl_available

    assert is_trl_available()  # the build takes the trl branch of the patch
    from trl.experimental.ppo import AutoModelForCausalLMWithValueHead

    def unpatched(self: torch.nn.Module, *args: object, **kwargs: object) -> dict:
        raise AssertionError("verl's monkey patch did not replace this")

    # An earlier build in this process may have patched the class already: start from a
    # stand-in (monkeypatch puts back what was there).
    monkeypatch.setattr(AutoModelForCausalLMWithValueHead, "state_dict", unpatched)

    module = engine._build_module()

    assert isinstance(module, torch.nn.Module)
    patched = AutoModelForCausalLMWithValueHead.__dict__["state_dict"]
    assert patched is not unpatched
    assert patched.__module__ == "verl.models.transformers.monkey_patch"
    # verl's replacement is torch.nn.Module's own state_dict (trl's added the value head's
    # weights under ``v_head.``): on any module it gives what torch.nn.Module gives.
    linear = torch.nn.Linear(2, 3)
    state = patched(linear)
    expected = torch.nn.Module.state_dict(linear)
    assert state.keys() == expected.keys() == {"weight", "bias"}
    assert all(torch.equal(state[k], expected[k]) for k in expected)
