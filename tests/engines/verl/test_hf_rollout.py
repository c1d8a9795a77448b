"""The transformers rollout (train.verl.ENGINE: hf) on GPUs: planned as verl's own CUDA
workers with our rollout registered through verl's plugin hook, and the server itself on a
machine without CUDA, as far as a CPU can take it (no CUDA run here: docs/gpu.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl.config import CPU_MODULE, HF_ROLLOUT_MODULE, ONCE_MODULE
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.verl_inputs import SMALL

HF_ON_GPUS = {**SMALL, "ENGINE": "hf"}


def test_the_hf_rollout_on_gpus_plans_verls_own_cuda_workers(inputs, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rl_pipeline.engines.verl.plan"):
        plan = plan_verl(VerlParams(**HF_ON_GPUS), DataParams(), RewardParams(), inputs,
                         gpus_visible=0, training=False, train_rows=16)
    config = plan.config
    assert config.actor_rollout_ref.rollout.name == "hf"
    assert config.trainer.device == "cuda"  # verl's own platform and workers, not the CPU's
    env = dict(config.ray_kwargs.ray_init.runtime_env.env_vars)
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"{ONCE_MODULE},{HF_ROLLOUT_MODULE}"
    assert "VERL_PLATFORM" not in env
    assert not any(o.startswith("trainer.device=") for o in plan.overrides)
    assert plan.hardware.tensor_parallel == 1  # auto: the rollout is one process
    assert "first-light and fallback mode" in plan.report["rollout"]
    assert "first-light and fallback mode" in caplog.text


def test_the_hf_rollout_on_gpus_refuses_what_it_cannot_run(inputs) -> None:
    bad = VerlParams(**{**HF_ON_GPUS, "rollout_tensor_model_parallel_size": 2,
                        "trainer_n_gpus_per_node": 2, "rollout_dtype": "float16"})
    with pytest.raises(PreflightError) as failure:
        plan_verl(bad, DataParams(), RewardParams(), inputs, gpus_visible=0, training=False,
                  train_rows=16)
    message = str(failure.value)
    assert ("train.verl.rollout_tensor_model_parallel_size=2: 1 (or auto) with ENGINE: hf"
            in message), message
    assert "train.verl.rollout_dtype='float16': float32, bfloat16 or auto" in message
    # An engine nobody registered names every one there is.
    with pytest.raises(PreflightError, match="one of vllm, sglang, trtllm, hf"):
        plan_verl(VerlParams(**{**SMALL, "ENGINE": "lmdeploy"}), DataParams(), RewardParams(),
                  inputs, gpus_visible=0, training=False, train_rows=16)


def test_verls_plugin_hook_registers_the_hf_rollout_without_the_cpu_platform() -> None:
    """What every Ray process of a GPU run does at ``import verl``: with only
    VERL_USE_EXTERNAL_MODULES set, the rollout is verl's to find and the CPU platform (and
    its gloo worker) is never loaded."""
    probe = (
        "import json, sys, verl\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "from verl.workers.rollout.replica import get_rollout_replica_class\n"
        "print(json.dumps({'replica': get_rollout_replica_class('hf').__qualname__,\n"
        "  'adapter': get_rollout_class('hf', 'async').__module__,\n"
        f"  'cpu_mode_loaded': {CPU_MODULE!r} in sys.modules}}))\n")
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env["VERL_USE_EXTERNAL_MODULES"] = HF_ROLLOUT_MODULE
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"replica": "HFReplica", "adapter": HF_ROLLOUT_MODULE,
                     "cpu_mode_loaded": False}


def test_the_hf_server_generates_where_no_cuda_is_seen(tiny_model_dir) -> None:
    """The server a GPU run starts, here on a machine without CUDA: it picks the CPU and
    float32 for ``dtype: auto``, answers concurrent requests as one batch, within each
    request's cap, with the log-probabilities verl compares with the actor's."""
    from rl_pipeline.engines.verl.hf_rollout import HFServer, compute_dtype, rollout_device

    assert rollout_device() == "cpu"
    assert str(compute_dtype("auto", "cuda")) == "torch.bfloat16"
    config = OmegaConf.create({"dtype": "auto", "seed": 3, "prompt_length": 16,
                               "response_length": 12, "custom": None})
    server = HFServer(config, OmegaConf.create({"path": str(tiny_model_dir)}), replica_rank=0)

    async def four_requests() -> list:
        params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        return await asyncio.gather(*[
            server.generate([5, 9, 2 + i % 2], {**params, "max_tokens": 4 + i}, f"r{i}")
            for i in range(4)])  # two prompts, twice each: as rollout.n sends them

    outputs = asyncio.run(four_requests())
    report = asyncio.run(server.adapter_report())
    assert (report["device"], report["dtype"]) == ("cpu", "float32")
    for i, output in enumerate(outputs):
        assert 1 <= len(output.token_ids) <= 4 + i
        assert len(output.log_probs) == len(output.token_ids)
        assert all(math.isfinite(p) and p <= 0 for p in output.log_probs)


def test_repeated_prompts_share_one_prefill_and_sample_as_without_it(tiny_model_dir) -> None:
    """verl sends a prompt's rollout.n samples as requests of their own: the server computes
    each distinct prompt once and copies its cache to the rows that repeat it. The same
    random numbers then draw the same tokens from the same logits (up to summation order)
    as a batch that computes every row, left padding included (a prompt that starts with
    the pad token is padded alike but is not the same prompt)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_pipeline.engines.verl.hf_rollout import shared_prompt_cache

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.eval()
    prompts = [[5, 9, 2, 7], [5, 9, 2, 7], [11, 3], [11, 3], [11, 3], [8, 1, 4], [0, 11, 3]]
    width = max(map(len, prompts))
    inputs = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(inputs)
    for row, prompt in enumerate(prompts):
        inputs[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1

    def sample(cache):
        torch.manual_seed(0)
        return model.generate(input_ids=inputs, attention_mask=mask, past_key_values=cache,
                              do_sample=True, max_new_tokens=8, min_new_tokens=8,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)

    with torch.no_grad():
        distinct = [0, 2, 5, 6]
        assert shared_prompt_cache(model, inputs[distinct], mask[distinct]) is None
        cache = shared_prompt_cache(model, inputs, mask)
        assert cache.get_seq_length() == width - 1
        assert cache.layers[0].keys.shape[0] == len(prompts)
        shared, plain = sample(cache), sample(None)
    assert torch.equal(shared.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(shared.logits), torch.stack(plain.logits),
                               atol=1e-4, rtol=1e-4)
