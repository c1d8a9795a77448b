"""vLLM's own parser on the `vllm serve` arguments that verl 0.9.1's rollout server builds.

verl's ``vLLMHttpServer.launch_server`` runs for real (in a child process, with vLLM 0.24.0
from ``make vllm-parser`` where vLLM is not installed); only the engine start is left out.
A flag vLLM does not know would end the first GPU run at the rollout server's start.
"""

from __future__ import annotations

import pytest

from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.engines.verl.vllm_args import (
    VLLM_VERSION,
    build_server_args,
    parser_path,
    vllm_source,
)
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.verl_inputs import SMALL

pytestmark = pytest.mark.gpu_boundary


@pytest.fixture(scope="module", autouse=True)
def vllm_importable() -> None:
    assert vllm_source() is not None, f"vLLM {VLLM_VERSION} is neither installed nor in " \
        f"{parser_path()}: run `make vllm-parser` (make test does)"


def _args(inputs, **verl):
    plan = plan_verl(VerlParams(**{**SMALL, **verl}), DataParams(), RewardParams(), inputs,
                     gpus_visible=0, training=False, train_rows=16)
    return plan, build_server_args(plan.config)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("setting", [
    pytest.param({}, id="default-lora-64"),
    pytest.param({"actor_model_lora_rank": 0}, id="full-fine-tuning"),
    pytest.param({"actor_model_lora_rank": 8}, id="lora-8"),
    pytest.param({"trainer_n_gpus_per_node": 2, "rollout_tensor_model_parallel_size": 2},
                 id="tensor-parallel-2"),
])
def test_vllm_parses_every_argument_verl_builds(inputs, setting) -> None:
    plan, built = _args(inputs, **setting)
    assert built.vllm == VLLM_VERSION
    assert built.error is None and built.unrecognized == [], built
    argv = built.argv
    assert argv[:2] == ["serve", plan.config.actor_rollout_ref.model.path]
    # rollout_disable_mm_preprocessor_cache=true, as vLLM 0.24 spells it
    assert _value(argv, "--mm_processor_cache_gb") == "0"
    assert _value(argv, "--tensor_parallel_size") == str(
        setting.get("rollout_tensor_model_parallel_size", 1))
    assert _value(argv, "--gpu_memory_utilization") == "0.6"
    rank = setting.get("actor_model_lora_rank", 64)
    assert ("--enable_lora" in argv) == (rank > 0)
    if rank:
        assert _value(argv, "--max_lora_rank") == str(rank)


def test_the_old_engine_kwarg_is_one_vllm_rejects(inputs) -> None:
    """What the spec name used to become: vLLM 0.24's parser exits 2 on it."""
    old = "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=true"
    plan = plan_verl(VerlParams(**SMALL), DataParams(), RewardParams(), inputs,
                     gpus_visible=0, training=False, train_rows=16)
    from rl_pipeline.engines.verl.config import compose_verl_config

    built = build_server_args(compose_verl_config([*plan.overrides, old]))
    assert built.unrecognized == ["--disable-mm-preprocessor-cache"]
    assert "exited with status 2" in built.error


def test_preflight_names_rejected_kwargs_and_missing_attention_together(inputs) -> None:
    verl = VerlParams(**SMALL, actor_model_attn_implementation="flash_attention_2", overrides=[
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=true",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.no_such_flag=3"])
    with pytest.raises(PreflightError) as failure:
        plan_verl(verl, DataParams(), RewardParams(), inputs, gpus_visible=0, training=False,
                  train_rows=16)
    message = str(failure.value)
    assert "train.verl.actor_model_attn_implementation='flash_attention_2'" in message
    assert "flash-attn is not importable here" in message
    for flag in ("--disable-mm-preprocessor-cache", "--no-such-flag"):
        assert f"`vllm serve` rejects {flag}" in message
    assert message.count("train.verl.overrides=") == 2


@pytest.mark.parametrize(("data", "length", "batched"), [
    pytest.param({}, 3072, "8192", id="qwen-defaults"),
    pytest.param({"data_max_prompt_length": 4096, "data_max_response_length": 8192}, 12288,
                 "12288", id="longer-than-a-batch"),
])
def test_a_model_of_long_context_gets_a_rollout_of_its_prompt_and_response(
        inputs, tmp_path, data, length, batched) -> None:
    """Qwen2.5's 32,768 positions: verl 0.9.1 made them vLLM's max_model_len and then, with
    chunked prefill off, assigned max_num_batched_tokens, a frozen field: the rollout server
    failed in its constructor ("Field 'max_num_batched_tokens' is frozen"), on the GPUs.
    The tiny model and SmolLM2 (2,048 and 8,192 positions) never showed it."""
    import dataclasses
    import json
    import shutil

    model = tmp_path / "long_context"
    shutil.copytree(inputs.model_path, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32768}))
    plan = plan_verl(VerlParams(**SMALL), DataParams(**data), RewardParams(),
                     dataclasses.replace(inputs, model_path=str(model)), gpus_visible=0,
                     training=False, train_rows=16)
    built = build_server_args(plan.config)
    assert built.error is None and built.unrecognized == [], built
    assert _value(built.argv, "--max_model_len") == str(length)
    assert _value(built.argv, "--max_num_batched_tokens") == batched
