"""Checks that verl itself makes only later, on the GPU workers, made here on a CPU.

Each failed check names the spec parameter, its value and what is allowed; all of them are
reported together. The rules follow verl 0.9.1: the per-GPU mini-batch arithmetic of its FSDP
workers, the rollout's tensor-parallel layout, the group estimators' need for several
samples, and the LoRA ranks vLLM accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement

from rl_pipeline.engines.problems import Problem
from rl_pipeline.params import ConfigError, DataParams
from rl_pipeline.params.verl import VerlParams

# Estimators whose advantage compares the samples of one prompt: they need rollout_n > 1.
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "opo", "reinforce_plus_plus_baseline", "gpg")
# vLLM's supported max_lora_rank values (verl rounds the rank up to one of these).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ROLLOUT_ENGINES = ("vllm", "sglang", "trtllm")
# The transformers rollout (rl_pipeline.engines.verl.hf_rollout): the only one on a CPU, a
# first-light and fallback mode on GPUs.
HF_ROLLOUT = "hf"


class GPUsNeededError(ConfigError):
    """verl was asked to train on a machine without (enough) CUDA GPUs."""


@dataclass(frozen=True)
class Hardware:
    """What the run will use: GPUs per node (ranks on a CPU), nodes, rollout tensor-parallel
    size, and the device: decided here once (:func:`resolve_hardware`), read by the rest of
    the plan."""

    gpus_per_node: int
    nnodes: int
    tensor_parallel: int
    device: Literal["cuda", "cpu"] = "cuda"

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nnodes


def resolve_hardware(verl: VerlParams, gpus_visible: int) -> Hardware:
    """Resolve the ``auto`` settings: all visible GPUs (one rank on a CPU), and tensor
    parallel min(2, GPUs) (1 for the transformers rollout, which is one process)."""
    if verl.device == "cpu":
        gpus_visible = 1  # one gloo rank unless trainer_n_gpus_per_node says more
    gpus = gpus_visible if verl.trainer_n_gpus_per_node == "auto" else verl.trainer_n_gpus_per_node
    auto_tp = 1 if verl.ENGINE == HF_ROLLOUT else min(2, max(gpus, 1))
    tp = (auto_tp if verl.rollout_tensor_model_parallel_size == "auto"
          else verl.rollout_tensor_model_parallel_size)
    return Hardware(gpus_per_node=gpus, nnodes=verl.trainer_nnodes, tensor_parallel=tp,
                    device=verl.device)


def check_verl(verl: VerlParams, data: DataParams, hardware: Hardware,
               train_prompts: int | None = None, gpus_visible: int | None = None,
               ray_address: str | None = None) -> list[Problem]:
    """Every problem with a verl configuration, or an empty list.

    Args:
        verl: ``train.verl``.
        data: The shared ``data`` group.
        hardware: The resolved GPUs and tensor-parallel size.
        train_prompts: Rows of ``train_prompts``, when known.
        gpus_visible: GPUs on this machine, when about to train (None: only checking).
        ray_address: The Ray cluster address, when one is configured.
    """
    problems: list[Problem] = []

    def fail(parameter: str, allowed: str) -> None:
        value = getattr(verl, parameter, None)
        if value is None and parameter.startswith("data_"):
            value = getattr(data, parameter)
        problems.append(Problem(parameter, value, allowed))

    if hardware.device == "cpu":
        problems += check_cpu(verl, hardware)
    elif verl.ENGINE == HF_ROLLOUT:
        problems += check_hf_rollout(verl, hardware)
    elif verl.ENGINE not in ROLLOUT_ENGINES:
        fail("ENGINE", f"one of {', '.join((*ROLLOUT_ENGINES, HF_ROLLOUT))}")
    elif verl.rollout_dtype != "bfloat16":
        # Caught otherwise only after training, by the rollout-versus-actor check: a
        # float32 rollout beside a bfloat16 actor measured Pearson 0.52 (docs/gpu.md).
        fail("rollout_dtype", "bfloat16 on GPUs: verl's FSDP actor computes in bfloat16, and "
             "a rollout in another precision samples a policy the actor does not compute")
    gpus, n = hardware.gpus, verl.rollout_n
    if gpus < 1:
        fail("trainer_n_gpus_per_node", "at least 1 GPU (verl trains on GPUs only)")
    else:
        if gpus % hardware.tensor_parallel:
            fail("rollout_tensor_model_parallel_size",
                 f"a divisor of the {gpus} GPUs (trainer_n_gpus_per_node x trainer_nnodes)")
        mini = verl.actor_ppo_mini_batch_size
        if (mini * n) % gpus:
            fail("actor_ppo_mini_batch_size", f"a value for which mini-batch x rollout_n "
                 f"({mini} x {n}) divides evenly over {gpus} GPUs")
        else:
            per_gpu = mini * n // gpus
            if per_gpu % verl.actor_ppo_micro_batch_size_per_gpu:
                fail("actor_ppo_micro_batch_size_per_gpu",
                     f"a divisor of the per-GPU mini-batch {per_gpu} (mini-batch {mini} x "
                     f"rollout_n {n} / {gpus} GPUs): {_divisors(per_gpu)}")
        if (verl.data_train_batch_size * n) % gpus:
            fail("data_train_batch_size", f"a value for which batch x rollout_n "
                 f"({verl.data_train_batch_size} x {n}) divides evenly over {gpus} GPUs")
        else:
            # verl computes the old and the reference log-probs of each GPU's whole share of
            # the step's batch in micro-batches of these sizes (workers/engine/utils.py
            # asserts the division), after the rollout: a wrong size fails only there.
            share = verl.data_train_batch_size * n // gpus
            reference = verl.actor_use_kl_loss or verl.algorithm_use_kl_in_reward
            for micro in ("rollout_log_prob_micro_batch_size_per_gpu",
                          *(["ref_log_prob_micro_batch_size_per_gpu"] if reference else [])):
                if share % getattr(verl, micro):
                    fail(micro, f"a divisor of each GPU's share of the step's batch, {share} "
                         f"(data_train_batch_size {verl.data_train_batch_size} x rollout_n "
                         f"{n} / {gpus} GPUs): {_divisors(share)}")
    if verl.data_train_batch_size < verl.actor_ppo_mini_batch_size:
        fail("data_train_batch_size", f"at least actor_ppo_mini_batch_size "
             f"({verl.actor_ppo_mini_batch_size})")
    if train_prompts is not None and verl.data_train_batch_size > train_prompts:
        fail("data_train_batch_size", f"at most the {train_prompts} training prompts (verl "
             "drops the last incomplete batch, so no step would run)")
    if verl.algorithm_adv_estimator in GROUP_ESTIMATORS and n < 2:
        fail("rollout_n", f"at least 2: {verl.algorithm_adv_estimator} compares the samples "
             "of each prompt")
    if verl.actor_fsdp_config_offload_policy and verl.actor_strategy != "fsdp2":
        fail("actor_fsdp_config_offload_policy", "false unless actor_strategy is fsdp2 (the "
             "CPU offload policy is an FSDP2 feature)")
    if verl.actor_model_lora_rank and verl.ENGINE == "vllm" and (
            verl.actor_model_lora_rank > VLLM_LORA_RANKS[-1]):
        fail("actor_model_lora_rank", f"0 (no LoRA) or at most {VLLM_LORA_RANKS[-1]}, the "
             f"largest LoRA rank vLLM accepts ({', '.join(map(str, VLLM_LORA_RANKS))})")
    if verl.actor_model_lora_dropout and not verl.actor_model_lora_rank:
        fail("actor_model_lora_dropout", "0 without LoRA (actor_model_lora_rank 0 trains all "
             "weights: there is no adapter to drop out)")
    if not verl.rollout_do_sample:
        # verl 0.9.1's vLLM rollout builds its sampling parameters from rollout_temperature,
        # top_p and top_k alone (experimental/agent_loop/agent_loop.py); do_sample is read
        # only by its unregistered HF rollout, so false would silently still sample.
        fail("rollout_do_sample", "true: verl's vLLM rollout always samples at "
             "rollout_temperature, so greedy rollouts cannot be had (GRPO-style estimators "
             "need varied samples anyway)")
    elif verl.rollout_temperature <= 0:
        fail("rollout_temperature", "greater than 0 when rollout_do_sample is true")
    if verl.trainer_save_freq < 1:
        # verl saves only with save_freq > 0 (then the last step too): -1 would train to the
        # end and leave merge nothing to export.
        fail("trainer_save_freq", "a positive number of steps (the last step is always "
             "saved too): the train stage exports the last checkpoint, so never saving, -1 "
             "in verl, cannot finish")
    if verl.trainer_test_freq == 0 or verl.trainer_test_freq < -1:
        fail("trainer_test_freq", "-1 (never) or a positive number of steps")
    if data.data_max_prompt_length + data.data_max_response_length > 131072:
        fail("data_max_response_length", "a prompt + response length within 131072 tokens")
    for spec in requirements(verl.pypi_packages_override):
        try:
            Requirement(spec)
        except InvalidRequirement as exc:
            fail("pypi_packages_override", f"comma-separated requirement specifiers; {spec!r} "
                 f"is not one ({exc})")
    if gpus_visible is not None and hardware.gpus_per_node > gpus_visible:
        fail("trainer_n_gpus_per_node", f"at most the {gpus_visible} GPUs visible here. "
             "verl needs CUDA GPUs; on a machine without them set train.engine=trl")
    if gpus_visible is not None and hardware.nnodes > 1 and not ray_address:
        fail("trainer_nnodes", "1, or a Ray cluster address (RAY_ADDRESS or conf/local) for "
             "several nodes")
    return problems


def check_cpu(verl: VerlParams, hardware: Hardware) -> list[Problem]:
    """What ``device: cpu`` cannot run (rl_pipeline.engines.verl.cpu wires verl's v1 sync
    trainer, its hybrid actor-rollout worker and a transformers rollout, nothing else)."""
    problems = []

    def fail(parameter: str, allowed: str) -> None:
        problems.append(Problem(parameter, getattr(verl, parameter), allowed))

    if verl.ENGINE != HF_ROLLOUT:
        fail("ENGINE", f"{HF_ROLLOUT}, or unset, with device: cpu (the transformers rollout; "
             "vLLM, SGLang and TensorRT-LLM need GPUs)")
    if verl.algorithm_adv_estimator == "gae":
        fail("algorithm_adv_estimator", "an estimator without a critic with device: cpu "
             "(grpo, reinforce_plus_plus, rloo, ...): the critic's worker is not wired for a CPU")
    if verl.algorithm_adv_estimator == "remax":
        fail("algorithm_adv_estimator", "not remax with device: cpu: remax runs on verl's "
             "legacy trainer, which the CPU mode does not wire")
    if verl.actor_model_lora_rank == 0:
        fail("actor_model_lora_rank", "at least 1 with device: cpu: without LoRA verl builds a "
             "separate reference model with pinned-memory offload, which needs an accelerator")
    if verl.actor_fsdp_config_offload_policy:
        fail("actor_fsdp_config_offload_policy", "false with device: cpu: the FSDP2 offload "
             "policy pins host memory, which needs an accelerator (and the model is already "
             "in host memory)")
    if hardware.tensor_parallel > hardware.gpus_per_node:
        # A replica of the transformers rollout is one server process for this many ranks
        # (it does not split the model): on a CPU one server for a node's ranks uses every
        # core, where several would compete for them.
        fail("rollout_tensor_model_parallel_size", "at most trainer_n_gpus_per_node with "
             "device: cpu: one rollout server serves that many ranks of a node")
    if verl.rollout_dtype not in ("float32", "bfloat16"):
        fail("rollout_dtype", "float32 or bfloat16 with device: cpu (the actor computes in "
             "the rollout's dtype, so that the rollout samples the policy it trains)")
    return problems


def check_hf_rollout(verl: VerlParams, hardware: Hardware) -> list[Problem]:
    """What ``ENGINE: hf`` on GPUs cannot run: the transformers rollout is one process per
    replica, and computes in float32 or bfloat16."""
    problems = []
    if hardware.tensor_parallel != 1:
        problems.append(Problem("rollout_tensor_model_parallel_size",
                                verl.rollout_tensor_model_parallel_size,
                                "1 (or auto) with ENGINE: hf: the transformers "
                                "rollout is one process per replica"))
    if verl.rollout_dtype not in ("float32", "bfloat16", "auto"):
        problems.append(Problem("rollout_dtype", verl.rollout_dtype, "float32, bfloat16 or "
                                "auto (bfloat16 on a GPU) with ENGINE: hf"))
    return problems


def check_gpus(hardware: Hardware, gpus_visible: int, configured: int | str) -> None:
    """Stop before anything starts when this machine cannot run verl (one clear message).

    Raises:
        GPUsNeededError: Naming the GPUs needed and found, and the trl engine.
    """
    needed = max(hardware.gpus_per_node, 1)
    if gpus_visible >= needed:
        return
    raise GPUsNeededError(
        f"verl needs {needed} CUDA GPU(s) per node "
        f"(train.verl.trainer_n_gpus_per_node={configured!r}) and this machine has "
        f"{gpus_visible}. On a machine without GPUs train with TRL instead: set "
        "train.engine: trl (or run with --env cpu); with fewer GPUs set "
        "train.verl.trainer_n_gpus_per_node: auto.")


def check_rollout_engine(verl: VerlParams) -> list[Problem]:
    """The rollout engine must be installed where training starts (hf: transformers, which
    the project needs anyway)."""
    import importlib.util

    if verl.ENGINE != HF_ROLLOUT and importlib.util.find_spec(verl.ENGINE) is None:
        return [Problem("ENGINE", verl.ENGINE, f"an installed rollout engine: {verl.ENGINE} is "
                        "not importable here (pip install -e '.[gpu]' installs vLLM)")]
    return []


def check_attention(verl: VerlParams) -> list[Problem]:
    """The attention kernel verl builds the models with must be importable here."""
    import importlib.util

    if verl.actor_model_attn_implementation == "flash_attention_2" and \
            importlib.util.find_spec("flash_attn") is None:
        return [Problem("actor_model_attn_implementation", "flash_attention_2",
                        "an installed attention kernel: flash-attn is not importable here "
                        "(it has no wheel for this torch and builds from source); use sdpa, "
                        "which is PyTorch's own")]
    return []


def requirements(override: str | None) -> list[str]:
    """The requirement specifiers of ``pypi_packages_override``."""
    return [part.strip() for part in (override or "").split(",") if part.strip()]


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
