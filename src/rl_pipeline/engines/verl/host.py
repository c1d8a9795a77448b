"""What the machines must have for a verl run, checked before anything starts: the NVIDIA
driver, CPUs for verl's Ray placement, disk for the kept checkpoints, GPU memory for the
packed micro-batches.

Each check is arithmetic on the composed verl config and the model's own files; the figures
are estimates of the worst case (every sequence at the prompt and response caps), written
out in the problem so that a user can see which number to change. The sizes follow verl
0.9.1 and vLLM 0.24.0 (docs/gpu.md, 'Preflight arithmetic').
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rl_pipeline.engines.nvidia import nvidia_smi_query
from rl_pipeline.models.facts import CUDA_CONTEXT_GIB, MERGE_COPIES, GiB, ModelFacts
from rl_pipeline.params import ConfigError

# torch 2.11 (the lock) pulls CUDA 13 libraries and vLLM 0.24's compiled core links
# libcudart.so.13: CUDA 13.0 needs an R580 driver or newer.
MIN_DRIVER = 580
DRIVER_HELP = (
    "Upgrade the NVIDIA driver to R580 or newer (CUDA 13; e.g. nvidia-driver-580-server on "
    "Ubuntu), or on a data-centre GPU install NVIDIA's CUDA 13 forward-compatibility package "
    "(cuda-compat-13-0) beside the older driver. The locked stack has no CUDA 12 build on "
    "the package index (docs/gpu.md, 'The NVIDIA driver'). Without a GPU stack, train with "
    "TRL: train.engine: trl.")
# verl 0.9.1's Ray placement: a worker bundle of max_colocate_count (3) CPUs per GPU
# (single_controller/ray/base.py), TransferQueue's controller and storage units at one CPU
# each (transfer_queue/controller.py, storage/simple_storage.py), and one CPU free for the
# actors that hold none once placed (TaskRunner, agent-loop and reward workers, rollout
# servers) but need one to be scheduled.
CPUS_PER_GPU = 3
TQ_CONTROLLER_CPUS = 1
SCHEDULING_CPUS = 1
# vLLM asleep (level 1, free_cache_engine: true, forced with LoRA): weights in host memory,
# the KV cache freed; what stays is its CUDA context and graphs.
VLLM_ASLEEP_GIB = 1.0


class DriverError(ConfigError):
    """The NVIDIA driver is too old for the locked CUDA 13 stack."""


def driver_version() -> str | None:
    """The NVIDIA driver version ``nvidia-smi`` reports (e.g. ``580.95.05``), or None where
    there is no nvidia-smi or it fails (no driver loaded)."""
    return nvidia_smi_query("driver_version")


def driver_problem(version: str | None, where: str = "this machine") -> str | None:
    """Why the driver ``version`` cannot run the locked stack, or None (no driver: the GPU
    count says it; a version too new to parse is let through)."""
    if version is None:
        return None
    match = re.match(r"(\d+)", version)
    if match and int(match[1]) < MIN_DRIVER:
        return (f"the NVIDIA driver on {where} is {version}; the locked GPU stack (torch "
                f"2.11 with CUDA 13, vLLM 0.24.0 linked to libcudart.so.13) needs "
                f"R{MIN_DRIVER} or newer. {DRIVER_HELP}")
    return None


def check_driver(where: str = "this machine") -> str | None:
    """Stop before anything starts on a driver too old for CUDA 13.

    Raises:
        DriverError: Naming the installed and the required version and what to do.

    Returns:
        The driver version, or None where there is no NVIDIA driver.
    """
    version = driver_version()
    problem = driver_problem(version, where)
    if problem:
        raise DriverError(f"verl cannot train here: {problem}")
    return version


def ray_cpus_needed(config: DictConfig) -> int:
    """The CPUs verl's placement holds on Ray (see :data:`CPUS_PER_GPU`)."""
    gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    units = int(config.transfer_queue.backend.SimpleStorage.num_data_storage_units)
    return CPUS_PER_GPU * gpus + TQ_CONTROLLER_CPUS + units + SCHEDULING_CPUS


def local_cpus(config: DictConfig) -> int:
    """The CPUs a local Ray started by verl offers: ``ray_kwargs.ray_init.num_cpus``, else
    what Ray detects (cgroup limits included)."""
    configured = config.ray_kwargs.ray_init.get("num_cpus")
    if configured:
        return int(configured)
    try:
        from ray._private.utils import get_num_cpus

        return int(get_num_cpus())
    except ImportError:  # Ray's private helper moved: the affinity mask is what it reads
        return len(os.sched_getaffinity(0))


def ray_cpu_problem(config: DictConfig, available: float, where: str) -> str | None:
    """Why ``available`` CPUs cannot place verl's actors, or None."""
    needed = ray_cpus_needed(config)
    if available >= needed:
        return None
    gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    units = int(config.transfer_queue.backend.SimpleStorage.num_data_storage_units)
    return (f"at least {needed} CPUs on Ray for verl's placement, {where} has {available:g}: "
            f"{CPUS_PER_GPU} per GPU x {gpus} GPU(s), TransferQueue's controller and "
            f"{units} storage unit(s) at 1 each, 1 free to place the other actors. verl would "
            "wait for the placement until train.ray_placement_timeout_s. Fewer storage units: "
            "train.verl.overrides: ['transfer_queue.backend.SimpleStorage."
            "num_data_storage_units=1'] (each holds part of a step's batch in memory)")


@dataclass(frozen=True)
class DiskPlan:
    """The disk a run fills: each checkpoint, how many verl keeps, and merge's copies."""

    checkpoint_gib: float
    checkpoints_kept: int
    merge_gib: float
    lora_only: bool

    @property
    def total_gib(self) -> float:
        return self.checkpoint_gib * self.checkpoints_kept + self.merge_gib


def disk_plan(config: DictConfig, facts: ModelFacts, planned_steps: int) -> DiskPlan:
    """What verl's checkpoints and merge write, estimated.

    verl's FSDP checkpoint of a LoRA run holds the full model state in fp32 unless
    ``checkpoint.save_lora_only`` (utils/checkpoint/fsdp_checkpoint_manager.py), plus the
    optimizer's two fp32 Adam moments of every trainable weight; full fine-tuning trains
    every weight.
    """
    actor = config.actor_rollout_ref.actor
    lora = config.actor_rollout_ref.model.lora_rank > 0
    trainable = facts.lora_parameters if lora else facts.parameters
    lora_only = bool(lora and actor.checkpoint.get("save_lora_only", False))
    contents = set(actor.checkpoint.save_contents)
    size = 0
    if "model" in contents:
        size += 4 * (facts.lora_parameters if lora_only else facts.parameters)
    if "optimizer" in contents:
        size += 8 * trainable
    if "hf_model" in contents:
        size += facts.bytes_on_disk
    saves = times_in(planned_steps, config.trainer.save_freq)
    keep = config.trainer.get("max_actor_ckpt_to_keep")
    kept = min(saves, keep) if keep else saves
    return DiskPlan(checkpoint_gib=size / GiB, checkpoints_kept=kept,
                    merge_gib=MERGE_COPIES * facts.bytes_on_disk / GiB, lora_only=lora_only)


def times_in(steps: int, freq: int) -> int:
    """How often verl does what it does every ``freq`` steps (and at the last step) in a run
    of ``steps``: checkpoints (save_freq), validations (test_freq); never at -1."""
    return 0 if freq <= 0 else -(-steps // freq)


def disk_problem(plan: DiskPlan, folder: str, free_gib: float) -> str | None:
    """Why ``free_gib`` at ``folder`` cannot hold ``plan``, or None."""
    if free_gib >= plan.total_gib:
        return None
    layout = "the LoRA weights" if plan.lora_only else "the full model state in fp32"
    return (f"{plan.total_gib:.1f} GiB free where the checkpoints go ({folder}), "
            f"{free_gib:.1f} GiB there: {plan.checkpoints_kept} kept checkpoint(s) of "
            f"{plan.checkpoint_gib:.2f} GiB ({layout} and the optimizer state) + "
            f"{plan.merge_gib:.2f} GiB for merge's export and merged model. Keep fewer: "
            "train.verl.trainer_max_actor_ckpt_to_keep (or save less often: "
            "train.verl.trainer_save_freq), or free space")


def free_gib(path: str) -> float:
    """Free space on the file system that holds ``path`` (its nearest existing folder)."""
    here = Path(path).absolute()
    existing = next((p for p in (here, *here.parents) if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free / GiB


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's worst case in each phase of a step, in GiB."""

    rollout_gib: float      # the rollout's share (vLLM's, or the transformers rollout's)
    actor_static_gib: float  # weights, gradients, optimizer state resident on the GPU
    update_gib: float       # one update micro-batch: logits, checkpointed inputs, mask
    log_prob_gib: float     # one log-prob micro-batch (no gradient): logits, mask
    rollout_during_actor_gib: float  # what the rollout holds while the actor works
    packed_tokens: int      # the largest packed micro-batch, in tokens
    rollout: str = "vLLM"   # which rollout, for the messages

    @property
    def actor_peak_gib(self) -> float:
        return (CUDA_CONTEXT_GIB + self.actor_static_gib + self.rollout_during_actor_gib
                + max(self.update_gib, self.log_prob_gib))

    @property
    def rollout_peak_gib(self) -> float:
        return CUDA_CONTEXT_GIB + self.actor_static_gib + self.rollout_gib

    def as_dict(self) -> dict[str, Any]:
        out = {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}
        return {**out, "actor_peak_gib": round(self.actor_peak_gib, 2),
                "rollout_peak_gib": round(self.rollout_peak_gib, 2)}


def memory_plan(config: DictConfig, facts: ModelFacts, gpu_gib: float,
                hf_rollout: bool = False) -> MemoryPlan:
    """Each phase's worst case on one GPU of ``gpu_gib``; ``hf_rollout``: the transformers
    rollout (``train.verl.ENGINE: hf``) instead of vLLM's.

    With sequence packing (``use_remove_padding``) a micro-batch is one row of all its
    tokens; with sdpa, transformers builds a dense block-causal mask over it and torch's
    kernel turns it into a bf16 bias: 3 bytes per token pair, quadratic in the packed
    tokens. The logits are vocabulary-wide per token (bf16; about three such tensors live
    in the backward pass). With gradient checkpointing each layer keeps its bf16 input.
    """
    arr = config.actor_rollout_ref
    rollout, actor, model = arr.rollout, arr.actor, arr.model
    gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    tokens = config.data.max_prompt_length + config.data.max_response_length
    packed = bool(model.use_remove_padding)
    sdpa = model.get("override_config", {}).get("attn_implementation",
                                                "flash_attention_2") != "flash_attention_2"

    def micro_batch(sequences: int, backward: bool) -> tuple[float, int]:
        n = sequences * tokens
        logits = (3 if backward else 1) * n * facts.vocab_size * 2
        mask = 0
        if sdpa:
            mask = 3 * (n * n if packed else sequences * tokens * tokens)
        kept = n * facts.hidden_size * 2 * facts.layers if backward else 0
        return (logits + mask + kept) / GiB, n

    update, n_update = micro_batch(actor.ppo_micro_batch_size_per_gpu, backward=True)
    log_prob, n_log = micro_batch(max(rollout.log_prob_micro_batch_size_per_gpu,
                                      arr.ref.log_prob_micro_batch_size_per_gpu or 0),
                                  backward=False)
    lora = model.lora_rank > 0
    trainable = facts.lora_parameters if lora else facts.parameters
    if actor.fsdp_config.get("offload_policy"):
        # FSDP2's CPU offload policy keeps weights, gradients and optimizer state in host
        # memory and brings one layer's weights at a time.
        static = 2 * 4 * facts.parameters / max(facts.layers, 1)
    else:
        static = 4 * facts.parameters / gpus + 12 * trainable / gpus
    if hf_rollout:
        # No reserved pool: its own model copy, which stays while the actor works, and
        # during generation a step's KV cache (bounded by hidden_size per layer: grouped-
        # query attention stores less) and the float32 scores over the vocabulary, twice.
        # The lent H100's first light reserved none of vLLM's 47.5 GiB (docs/gpu.md).
        weight_bytes = 4 if str(rollout.dtype) in ("float32", "fp32") else 2
        weights = weight_bytes * facts.parameters
        sequences = config.data.train_batch_size * rollout.n / gpus
        kv = sequences * tokens * facts.layers * 2 * facts.hidden_size * weight_bytes
        scores = 2 * sequences * facts.vocab_size * 4
        return MemoryPlan(rollout_gib=(weights + kv + scores) / GiB,
                          actor_static_gib=static / GiB, update_gib=update,
                          log_prob_gib=log_prob, rollout_during_actor_gib=weights / GiB,
                          packed_tokens=max(n_update, n_log), rollout="the transformers rollout")
    vllm = rollout.gpu_memory_utilization * gpu_gib
    during_actor = VLLM_ASLEEP_GIB if rollout.free_cache_engine else vllm
    return MemoryPlan(rollout_gib=vllm, actor_static_gib=static / GiB, update_gib=update,
                      log_prob_gib=log_prob, rollout_during_actor_gib=during_actor,
                      packed_tokens=max(n_update, n_log))


def memory_problem(plan: MemoryPlan, gpu_gib: float) -> str | None:
    """Why ``plan`` cannot fit a GPU of ``gpu_gib``, or None."""
    if plan.actor_peak_gib <= gpu_gib and plan.rollout_peak_gib <= gpu_gib:
        return None
    if plan.actor_peak_gib > gpu_gib:
        biggest = max(("update", plan.update_gib), ("log-prob", plan.log_prob_gib),
                      key=lambda kv: kv[1])
        return (f"a step that fits {gpu_gib:g} GiB per GPU: the actor's worst case is "
                f"{plan.actor_peak_gib:.1f} GiB = the {biggest[0]} micro-batch "
                f"{biggest[1]:.1f} GiB ({plan.packed_tokens} packed tokens at the prompt + "
                f"response caps: logits and a dense attention mask quadratic in them) + "
                f"resident state {plan.actor_static_gib:.1f} GiB + {plan.rollout} "
                f"{plan.rollout_during_actor_gib:.1f} GiB + {CUDA_CONTEXT_GIB:g} GiB CUDA "
                "context. Lower actor_ppo_micro_batch_size_per_gpu / "
                "rollout_log_prob_micro_batch_size_per_gpu / "
                "ref_log_prob_micro_batch_size_per_gpu, data.data_max_response_length"
                + (", or rollout_gpu_memory_utilization (set rollout_free_cache_engine: true "
                   "so that vLLM sleeps while the actor works)" if plan.rollout == "vLLM"
                   else ""))
    share, lever = (("rollout_gpu_memory_utilization", "rollout_gpu_memory_utilization")
                    if plan.rollout == "vLLM" else
                    ("its model copy, a step's KV cache and scores",
                     "data_train_batch_size or rollout_n"))
    return (f"a rollout that fits {gpu_gib:g} GiB per GPU: {plan.rollout}'s "
            f"{plan.rollout_gib:.1f} GiB ({share}) + the actor's "
            f"resident {plan.actor_static_gib:.1f} GiB + {CUDA_CONTEXT_GIB:g} GiB context = "
            f"{plan.rollout_peak_gib:.1f} GiB. Lower {lever} or turn on "
            "actor_fsdp_config_offload_policy")
