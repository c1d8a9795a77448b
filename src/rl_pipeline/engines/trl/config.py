"""The spec-name -> TRL 1.12 ``GRPOConfig`` field table, and the configs built from it.

One table holds the mapping (:data:`MAPPING`: the names TRL shares with the spec,
:data:`SAME_NAME`, and its one rename, :data:`RENAMED`); the parameters it does not cover
are listed, with where they go, in :data:`NOT_GRPO_KEYS`. ``GRPOConfig`` is a dataclass,
so a field that TRL renames or drops makes :func:`grpo_config` fail with a TypeError, in a
test rather than in a training run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rl_pipeline.params import FOLLOWERS
from rl_pipeline.params.trl import TrlParams

if TYPE_CHECKING:  # trl and peft are heavy imports: load them only when a config is built
    from peft import LoraConfig
    from trl import GRPOConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mapping:
    """One spec parameter and the ``GRPOConfig`` field it sets (``note``: why they differ)."""

    spec: str
    field: str
    note: str = ""


# The spec's parameters (and ours, last) that are GRPOConfig fields of the same name, in the
# spec's order: GRPO algorithm, training, text generation, evaluation, logging and saving,
# miscellaneous.
SAME_NAME: tuple[str, ...] = (
    "beta", "epsilon", "num_iterations", "num_generations",
    "num_train_epochs", "max_steps", "per_device_train_batch_size", "per_device_eval_batch_size",
    "gradient_accumulation_steps", "learning_rate", "max_grad_norm", "optim",
    "lr_scheduler_type",
    "max_completion_length", "chat_template_kwargs", "temperature", "top_p",
    "do_eval", "eval_strategy", "eval_steps",
    "logging_steps", "save_steps", "save_total_limit",
    "shuffle_dataset", "use_liger_kernel", "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "loss_type", "scale_rewards", "seed", "use_vllm", "vllm_mode",
)
# The one parameter whose GRPOConfig field has another name, and why.
RENAMED: dict[str, tuple[str, str]] = {
    "warmup_ratio": ("warmup_steps", "transformers 5 deprecates warmup_ratio; warmup_steps "
                     "below 1 is the same ratio"),
}
# What the engine does to a field on its own (grpo_config).
NOTES: dict[str, str] = {
    "use_liger_kernel": "forced off on CPU (Liger is Triton/GPU)",
    "use_vllm": "forced off on CPU (vLLM needs a GPU)",
}
MAPPING: tuple[Mapping, ...] = (
    *(Mapping(name, name, NOTES.get(name, "")) for name in SAME_NAME),
    *(Mapping(spec, field, note) for spec, (field, note) in RENAMED.items()),
)

# Parameters that are no GRPOConfig field, and where each goes instead.
NOT_GRPO_KEYS: dict[str, str] = {
    "apply_lora": "peft LoraConfig or none (lora_config)",
    "lora_rank": "peft LoraConfig.r",
    "lora_alpha": "peft LoraConfig.lora_alpha",
    "lora_target_modules": "peft LoraConfig.target_modules",
    "lora_dropout": "peft LoraConfig.lora_dropout",
    "deepspeed_config": "GRPOConfig.deepspeed, on GPU only",
    "max_prompt_length": "follows data.data_max_prompt_length, which data_prep fits every "
                         "prompt to (TRL 1.12 has no prompt cap)",
    "algorithm_adv_estimator": "our advantage computation in the trainer",
}


def grpo_values(params: TrlParams) -> dict[str, Any]:
    """The ``GRPOConfig`` keyword arguments that :data:`MAPPING` gives for ``params``.

    A follower not yet resolved (null: ``train.trl`` validated without its owners, outside a
    Kedro run) is left out, so TRL's own default applies; a run resolves them before any node
    (:func:`rl_pipeline.params.resolve_followers`).
    """
    values = {m.field: getattr(params, m.spec) for m in MAPPING}
    return {k: v for k, v in values.items() if v is not None or k not in _FOLLOWER_FIELDS}


# GRPOConfig fields set by a follower of another group (rl_pipeline.params.FOLLOWERS).
_FOLLOWER_FIELDS = {m.field for m in MAPPING
                    if f"train.trl.{m.spec}" in {f.name for f in FOLLOWERS}}


# What the train stage sets beyond the parameters, so that the preflight's resolved config
# (train/train_config_resolved.yaml) is the one that trains. report_to mlflow: TRL then
# times its own phases into the stage's run (profiling/Time taken: ...: generation, the
# reward, the loss), as verl logs timing_s/*; transformers' MLflowCallback, which that also
# adds, is removed in training (StepLogger logs the metrics).
TRAINING_ARGS: dict[str, Any] = {"save_strategy": "steps", "logging_strategy": "steps",
                                 "report_to": ["mlflow"]}


def grpo_config(params: TrlParams, output_dir: str, *, use_cpu: bool,
                report_to: list[str] | str = "none", **extra: Any) -> GRPOConfig:
    """TRL's ``GRPOConfig`` from ``train.trl``.

    Args:
        params: The validated ``train.trl`` group.
        output_dir: Where the trainer writes checkpoints.
        use_cpu: Train on CPU: float32, no DeepSpeed, Liger or vLLM (each set to off quietly,
            with a log line when it was asked for), so one parameter file serves both.
        report_to: The trainer's loggers ("none": the pipeline logs to MLflow itself).
        **extra: Further ``GRPOConfig`` fields the engine sets (save_strategy, bf16, ...).
            They may not overrule a mapped parameter: the table is the one source for those.

    Returns:
        The config; GRPOConfig's own checks (e.g. batch divisible by num_generations) have run.
    """
    from trl import GRPOConfig

    values = grpo_values(params)
    clash = sorted(set(extra) & (set(values) | {"use_cpu", "deepspeed"}))
    if clash:
        raise ValueError(f"set these through train.trl or use_cpu, not extra: {clash}")
    if use_cpu:
        for name in ("use_liger_kernel", "use_vllm", "deepspeed_config"):
            if getattr(params, name):
                logger.warning("train.trl.%s is ignored on CPU", name)
        # bf16 on CPU is slow and TRL would default it to True; Liger and vLLM need CUDA.
        values.update(use_liger_kernel=False, use_vllm=False)
        device = {"use_cpu": True, "bf16": False, "deepspeed": None}
    else:
        device = {"use_cpu": False, "deepspeed": params.deepspeed_config}
    # transformers' Trainer copies TrainingArguments.use_cache (False) into the model config,
    # and TRL's generation config does not override it, so transformers-based rollouts would
    # recompute the whole sequence for every new token: 12x slower on SmolLM2 (213 s against
    # 18 s for 8 x 128 tokens on 2 cores). Generation only; training keeps the cache off.
    # Not with vLLM: TRL hands generation_kwargs to vLLM's SamplingParams, which has no
    # use_cache and raises TypeError at the first generation (vLLM caches anyway).
    generation = {} if values.get("use_vllm") else {"generation_kwargs": {"use_cache": True}}
    return GRPOConfig(output_dir=output_dir, report_to=report_to,
                      **{**values, **device, **generation, **extra})


def lora_config(params: TrlParams) -> LoraConfig | None:
    """peft's ``LoraConfig`` for the policy, or None to train all weights (apply_lora false)."""
    if not params.apply_lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=params.lora_rank, lora_alpha=params.lora_alpha,
                      lora_dropout=params.lora_dropout,
                      target_modules=params.lora_target_modules, task_type="CAUSAL_LM")
