"""Preflight's arithmetic on the machine (rl_pipeline.engines.verl.host): the NVIDIA driver,
Ray's CPUs for verl's placement, the disk for the kept checkpoints, one GPU's memory for the
packed micro-batches. Each refusal is checked through plan_verl on verl's composed config and
a real (tiny) model folder; a stand-in nvidia-smi plays an old driver."""

from __future__ import annotations

import pytest

from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl import plan as verl_plan
from rl_pipeline.engines.verl.config import compose_verl_config
from rl_pipeline.engines.verl.host import (
    DriverError,
    MemoryPlan,
    disk_plan,
    local_cpus,
    memory_plan,
    memory_problem,
    ray_cpus_needed,
)
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.models.facts import ModelFacts
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.verl_inputs import SMALL

# Slow: verl's whole configuration composed and checked (plan_verl) with the tiny model.
pytestmark = pytest.mark.slow


def _plan(inputs, training: bool = False, gpus: int = 0, data: DataParams | None = None,
          **verl):
    return plan_verl(VerlParams(**{**SMALL, **verl}), data or DataParams(), RewardParams(),
                     inputs, gpus_visible=gpus, training=training, train_rows=16)


def _problems(inputs, **kwargs) -> dict[str, str]:
    with pytest.raises(PreflightError) as err:
        _plan(inputs, **kwargs)
    return {f"{p.group}.{p.parameter}": p.allowed for p in err.value.problems}


def test_an_old_driver_stops_training_naming_both_versions(inputs, old_driver) -> None:
    # torch sees no GPU under a CUDA 12 driver: the driver is named, not "0 GPUs".
    with pytest.raises(DriverError) as err:
        _plan(inputs, training=True, gpus=0)
    message = str(err.value)
    assert old_driver in message and "R580" in message
    assert "libcudart.so.13" in message and "train.engine: trl" in message


def test_checking_on_a_machine_with_an_old_driver_lists_it(inputs, old_driver) -> None:
    problems = _problems(inputs)
    assert old_driver in problems["machine.nvidia_driver"]
    assert "R580 or newer" in problems["machine.nvidia_driver"]


def test_a_machine_without_a_driver_is_not_refused_for_it(inputs, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    plan = _plan(inputs)
    assert plan.report["host"]["nvidia_driver"] is None


def test_too_few_cpus_for_verls_placement_are_refused_with_the_count(inputs) -> None:
    # Training here on one (declared) GPU: verl's local Ray gets this machine's CPUs.
    problems = _problems(inputs, training=True, gpus=1)
    config = compose_verl_config(["trainer.n_gpus_per_node=1"])
    needed, here = ray_cpus_needed(config), local_cpus(config)
    assert needed == 3 + 1 + 8 + 1  # a bundle of 3 per GPU, TransferQueue 1 + 8, 1 free
    if here >= needed:
        pytest.skip(f"this machine has {here} CPUs, enough for verl's {needed}")
    message = problems["train.verl.trainer_n_gpus_per_node"]
    assert f"at least {needed} CPUs on Ray" in message and f"this machine has {here}" in message
    assert "num_data_storage_units=1" in message  # what to change


def test_fewer_storage_units_fit_and_the_count_is_reported(inputs) -> None:
    units = ["transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
             "ray_kwargs.ray_init.num_cpus=6"]
    with pytest.raises(PreflightError) as err:  # vLLM is not installed here: refused for it
        _plan(inputs, training=True, gpus=1, overrides=units)
    assert "trainer_n_gpus_per_node" not in {p.parameter for p in err.value.problems}
    plan = _plan(inputs, overrides=units)
    assert plan.report["host"]["ray_cpus_needed"] == 6


def test_a_disk_too_small_for_the_kept_checkpoints_is_refused(inputs, monkeypatch) -> None:
    plan = _plan(inputs, total_training_steps=10, trainer_save_freq=2)
    facts = ModelFacts.read(inputs.model_path, 64, "all-linear")
    expected = disk_plan(plan.config, facts, 10)
    assert expected.checkpoints_kept == 5  # every checkpoint: verl keeps all by default
    assert plan.report["host"]["plan"]["checkpoints_kept"] == 5
    # The full model state in fp32, and the LoRA weights' two Adam moments.
    assert expected.checkpoint_gib * 2**30 == pytest.approx(
        4 * facts.parameters + 8 * facts.lora_parameters)
    # The file system holding the checkpoints, as full as a shared box's can be.
    free = expected.total_gib * 0.9
    monkeypatch.setattr(verl_plan, "free_gib", lambda path: free)
    message = _problems(inputs, total_training_steps=10, trainer_save_freq=2)[
        "train.verl.trainer_max_actor_ckpt_to_keep"]
    assert f"{expected.total_gib:.1f} GiB free where the checkpoints go" in message
    assert f"{free:.1f} GiB there" in message
    assert "5 kept checkpoint(s)" in message and "full model state in fp32" in message
    # Keeping one fits.
    kept = _plan(inputs, total_training_steps=10, trainer_save_freq=2,
                 trainer_max_actor_ckpt_to_keep=1)
    assert kept.report["host"]["plan"]["checkpoints_kept"] == 1


def test_a_packed_micro_batch_that_cannot_fit_the_gpu_is_refused(inputs) -> None:
    # 40 sequences (a GPU's whole share: 8 prompts x 5) of 1024 + 2048 tokens packed into one
    # row: 122,880 tokens, whose dense attention mask alone is 3 bytes x 122,880^2 = 42 GiB.
    micro = {"rollout_log_prob_micro_batch_size_per_gpu": 40,
             "ref_log_prob_micro_batch_size_per_gpu": 40}
    message = _problems(inputs, gpu_memory_gib=40, **micro)["train.verl.gpu_memory_gib"]
    assert "fits 40 GiB per GPU" in message and "122880 packed tokens" in message
    assert "log-prob micro-batch" in message
    # The same on an 80 GiB card with vLLM asleep while the actor works fits.
    plan = _plan(inputs, gpu_memory_gib=80, rollout_free_cache_engine=True, **micro)
    memory = plan.report["host"]["gpu_memory"]
    assert memory["packed_tokens"] == 122880 and memory["actor_peak_gib"] < 80
    # The mask is what grows: half the sequences, half the logits and a quarter of the mask.
    facts = ModelFacts.read(inputs.model_path, 64, "all-linear")
    config = plan.config.copy()
    config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = 20
    config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = 20
    half = memory_plan(config, facts, 80)
    mask = 3 * 122880**2 / 2**30
    logits = memory["log_prob_gib"] - mask
    assert half.log_prob_gib == pytest.approx(logits / 2 + mask / 4, abs=0.01)


def test_the_model_facts_come_from_the_model_files(inputs) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(inputs.model_path)
    facts = ModelFacts.read(inputs.model_path, 8, "[q_proj,v_proj]")
    assert facts.parameters == sum(p.numel() for p in model.parameters())
    assert facts.vocab_size == model.config.vocab_size
    # LoRA on q_proj and v_proj only, as peft counts it.
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainable, _ = peft.get_nb_trainable_parameters()
    assert facts.lora_parameters == trainable


def test_a_ray_cluster_with_too_few_cpus_is_refused_with_the_count(inputs) -> None:
    """The cluster's CPUs as check_nodes reports them (ray.cluster_resources), against
    verl's placement for 2 nodes x 4 GPUs: 3 x 8 + 1 + 8 + 1 = 34."""
    from dataclasses import replace

    from rl_pipeline.engines.verl.plan import _check_host

    on_cluster = replace(inputs, ray_address="ray://head:10001")
    verl = VerlParams(**{**SMALL, "trainer_nnodes": 2, "trainer_n_gpus_per_node": 4})
    config = compose_verl_config(["trainer.nnodes=2", "trainer.n_gpus_per_node=4",
                                  f"data.train_files={inputs.train_files}",
                                  f"data.val_files={inputs.val_files}"])
    cluster = {"checked": True, "cpus": 32.0, "nodes": []}
    problems = _check_host(verl, config, on_cluster, {"cluster": cluster}, cpu=False, local=False,
                           cluster=True)
    (problem,) = [p for p in problems if p.parameter == "ray_address"]
    assert "at least 34 CPUs on Ray for verl's placement" in problem.allowed
    assert "the cluster at ray://head:10001 has 32" in problem.allowed
    assert not [p for p in _check_host(verl, config, on_cluster,
                                       {"cluster": {**cluster, "cpus": 34.0}}, cpu=False,
                                       local=False,
                                       cluster=True) if p.parameter == "ray_address"]


def test_the_transformers_rollout_is_sized_by_its_model_and_batch_not_vllms_share(
        inputs) -> None:
    # First light on the lent H100 (ENGINE hf) was planned at vLLM's 0.6 x 79.2 = 47.5 GiB,
    # and the run's rollout held a copy of the tiny model.
    facts = ModelFacts.read(inputs.model_path, 8, "all-linear")
    vllm = _plan(inputs, gpu_memory_gib=80).report["host"]["gpu_memory"]
    assert vllm["rollout"] == "vLLM"
    assert vllm["rollout_gib"] == pytest.approx(
        VerlParams().rollout_gpu_memory_utilization * 80, abs=0.01)
    hf = _plan(inputs, gpu_memory_gib=80, ENGINE="hf").report["host"]["gpu_memory"]
    assert hf["rollout"] == "the transformers rollout"
    weights = 2 * facts.parameters / 2**30  # bfloat16 on a GPU (rollout dtype auto)
    assert hf["rollout_during_actor_gib"] == pytest.approx(weights, abs=0.01)
    assert weights < hf["rollout_gib"] < vllm["rollout_gib"] / 10
    # The KV cache grows with the step's sequences: twice the prompts, more memory.
    more = _plan(inputs, gpu_memory_gib=80, ENGINE="hf",
                 data_train_batch_size=2 * SMALL["data_train_batch_size"])
    assert more.report["host"]["gpu_memory"]["rollout_gib"] > hf["rollout_gib"]


def test_a_transformers_rollout_that_cannot_fit_names_what_lowers_it() -> None:
    # Its share is its model copy and a step's cache: vLLM's memory setting does nothing.
    plan = MemoryPlan(rollout_gib=10, actor_static_gib=0.1, update_gib=0.1, log_prob_gib=0.1,
                      rollout_during_actor_gib=0.5, packed_tokens=64,
                      rollout="the transformers rollout")
    message = memory_problem(plan, 5)
    assert "the transformers rollout's 10.0 GiB (its model copy" in message
    assert "Lower data_train_batch_size or rollout_n" in message
    assert "rollout_gpu_memory_utilization" not in message
    vllm = memory_problem(MemoryPlan(**{**plan.__dict__, "rollout": "vLLM"}), 5)
    assert "Lower rollout_gpu_memory_utilization" in vllm
