"""Preflight: every rule verl would only apply on its GPU workers, checked on a CPU."""

from __future__ import annotations

import pytest

from rl_pipeline.engines.verl.preflight import Hardware, check_verl, resolve_hardware
from rl_pipeline.params import DataParams
from rl_pipeline.params.verl import VerlParams

SPEC_DEFAULT_HARDWARE = Hardware(gpus_per_node=8, nnodes=1, tensor_parallel=2)

# (changes to train.verl, changes to data, hardware, keyword arguments, parameter named)
INVALID = [
    ({"ENGINE": "lmdeploy"}, {}, None, {}, "ENGINE"),
    ({"ENGINE": "hf"}, {}, None, {}, "rollout_tensor_model_parallel_size"),  # tp 2 given
    ({"actor_ppo_micro_batch_size_per_gpu": 7}, {}, None, {},
     "actor_ppo_micro_batch_size_per_gpu"),
    ({"actor_ppo_mini_batch_size": 3}, {}, None, {}, "actor_ppo_mini_batch_size"),
    ({}, {}, Hardware(8, 1, 3), {}, "rollout_tensor_model_parallel_size"),
    ({"data_train_batch_size": 64}, {}, None, {}, "data_train_batch_size"),
    ({"data_train_batch_size": 1001}, {}, None, {}, "data_train_batch_size"),
    ({}, {}, None, {"train_prompts": 100}, "data_train_batch_size"),
    ({"rollout_n": 1}, {}, None, {}, "rollout_n"),
    ({"algorithm_adv_estimator": "rloo", "rollout_n": 1}, {}, None, {}, "rollout_n"),
    ({"actor_strategy": "fsdp"}, {}, None, {}, "actor_fsdp_config_offload_policy"),
    ({"actor_model_lora_rank": 1024}, {}, None, {}, "actor_model_lora_rank"),
    ({"rollout_temperature": 0.0}, {}, None, {}, "rollout_temperature"),
    ({"rollout_do_sample": False}, {}, None, {}, "rollout_do_sample"),
    ({"trainer_save_freq": 0}, {}, None, {}, "trainer_save_freq"),
    ({"trainer_test_freq": -5}, {}, None, {}, "trainer_test_freq"),
    ({"pypi_packages_override": "transformers==5.10.4, not a package!"}, {}, None, {},
     "pypi_packages_override"),
    ({}, {}, None, {"gpus_visible": 0}, "trainer_n_gpus_per_node"),
    ({}, {}, Hardware(0, 1, 1), {}, "trainer_n_gpus_per_node"),
    ({"trainer_nnodes": 2}, {}, Hardware(8, 2, 2), {"gpus_visible": 8}, "trainer_nnodes"),
    ({}, {"data_max_response_length": 200_000}, None, {}, "data_max_response_length"),
]


def test_the_spec_defaults_pass() -> None:
    assert check_verl(VerlParams(), DataParams(), SPEC_DEFAULT_HARDWARE) == []


@pytest.mark.parametrize(("verl", "data", "hardware", "kwargs", "parameter"), INVALID)
def test_invalid_configuration_is_named(verl, data, hardware, kwargs, parameter) -> None:
    params = VerlParams(**verl)
    problems = check_verl(params, DataParams(**data), hardware or resolve_hardware(params, 8),
                          **kwargs)
    assert parameter in [p.parameter for p in problems], problems
    message = str(next(p for p in problems if p.parameter == parameter))
    assert message.startswith(f"train.verl.{parameter}=")


def test_all_problems_are_reported_together() -> None:
    params = VerlParams(ENGINE="lmdeploy", rollout_n=1, trainer_save_freq=0)
    names = {p.parameter for p in check_verl(params, DataParams(), SPEC_DEFAULT_HARDWARE)}
    assert {"ENGINE", "rollout_n", "trainer_save_freq"} <= names
    assert params.rollout_name == "lmdeploy"  # follows ENGINE


def _told(parameter: str, value: object) -> list[str]:
    problems = check_verl(VerlParams(**{parameter: value}), DataParams(), SPEC_DEFAULT_HARDWARE)
    return [str(p) for p in problems if p.parameter == parameter]


@pytest.mark.parametrize(("parameter", "refused", "allowed", "why"), [
    # verl saves only with save_freq > 0: -1 trained to the end and left no checkpoint to
    # export, refused after the work.
    ("trainer_save_freq", (-1, 0, -7), 20, "a positive number of steps (the last step is "
     "always saved too): the train stage exports the last checkpoint, so never saving, -1 in "
     "verl, cannot finish"),
    # verl's FSDP actor computes in bfloat16 on GPUs: a float16 or float32 vLLM rollout
    # samples another policy, which only the check after training caught.
    ("rollout_dtype", ("float16", "float32", "auto"), "bfloat16", "bfloat16 on GPUs: verl's "
     "FSDP actor computes in bfloat16, and a rollout in another precision samples a policy "
     "the actor does not compute"),
], ids=["never saved", "rollout precision"])
def test_a_run_that_would_fail_after_its_work_is_refused_before(parameter, refused, allowed,
                                                                  why) -> None:
    for value in refused:
        assert _told(parameter, value) == [f"train.verl.{parameter}={value!r}: {why}"]
    assert _told(parameter, allowed) == []
    assert _told("trainer_test_freq", -1) == []  # never validating is fine


def test_auto_hardware_resolves_from_the_visible_gpus() -> None:
    params = VerlParams(trainer_n_gpus_per_node="auto", rollout_tensor_model_parallel_size="auto")
    assert resolve_hardware(params, 1) == Hardware(1, 1, 1)
    assert resolve_hardware(params, 4) == Hardware(4, 1, 2)
    one_gpu = VerlParams(trainer_n_gpus_per_node="auto", rollout_tensor_model_parallel_size="auto",
                         data_train_batch_size=8, actor_ppo_mini_batch_size=8,
                         actor_rft_mini_batch_size=8)
    assert check_verl(one_gpu, DataParams(), resolve_hardware(one_gpu, 1), gpus_visible=1) == []


def test_verl_itself_would_let_greedy_rollouts_through() -> None:
    """Why preflight refuses rollout_do_sample=false: verl's own validation accepts it, and its
    vLLM rollout then samples at rollout_temperature regardless (agent_loop.py builds the
    sampling parameters from temperature, top_p and top_k only)."""
    from rl_pipeline.engines.verl.checks import validate_with_verl
    from rl_pipeline.engines.verl.config import compose_verl_config, hydra_overrides, spec_values

    params = VerlParams(rollout_do_sample=False)
    config = compose_verl_config(hydra_overrides(spec_values(params, DataParams())))
    assert config.actor_rollout_ref.rollout.do_sample is False
    assert validate_with_verl(config) == []
    problems = check_verl(params, DataParams(), SPEC_DEFAULT_HARDWARE)
    assert [p.parameter for p in problems] == ["rollout_do_sample"]
    assert "always samples at rollout_temperature" in str(problems[0])
