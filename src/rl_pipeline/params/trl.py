"""The trl engine's parameters: every parameter of the grpo_trl_component spec, by its spec
name, with the spec's default, and a few of ours (marked below) that the spec leaves to TRL.

The spec's inputs that are not parameters live elsewhere, so they are not repeated here:

- ``dataset_train_split``, ``dataset_validation_split`` and ``dataset_name``: the catalog
  entries ``raw_train`` and ``raw_val`` (``conf/base/catalog.yml``, settable under those names
  with ``kedro run --params``).
- ``model_name_or_path``: the catalog entry ``base_model``.
- ``dataset_prompt_column``: the ``data_prep`` group (:class:`~rl_pipeline.params.DataPrepParams`),
  since data_prep builds the prompts for both engines.

``deepspeed_config`` is kept here (an optional path) because it configures the trainer.
How each parameter reaches TRL's ``GRPOConfig``: :mod:`rl_pipeline.engines.trl.config`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from rl_pipeline.params.base import ParamGroup
from rl_pipeline.params.verl import ADV_ESTIMATORS

OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor", "ademamix", "sgd", "adagrad",
              "rmsprop", "galore_adamw", "lomo", "adalomo", "grokadamw", "schedule_free_sgd")
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                 "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau")
# TRL 1.12's GRPOConfig.loss_type values (grpo_trainer._compute_loss).
# REINFORCE++ through a small GRPOTrainer subclass (rl_pipeline.engines.trl.reinforce_pp).
TRL_ESTIMATORS = ("grpo", "reinforce_plus_plus")
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


class TrlParams(ParamGroup):
    """``train.trl``: GRPO (and REINFORCE++ advantages) with TRL's GRPOTrainer, CPU or GPU."""

    group: ClassVar[str] = "train.trl"

    # LoRA
    apply_lora: bool = Field(
        True, description="Train a LoRA adapter (true) or all weights (false). The spec's "
        "strings 'true'/'false' are accepted.")
    # Text generation
    max_prompt_length: int | None = Field(
        None, gt=0,
        description="Maximum prompt tokens (spec default 512). TRL 1.12 has no prompt cap: "
        "data_prep fits every prompt to data.data_max_prompt_length, so this follows that "
        "(null); another value is refused.")
    max_completion_length: int | None = Field(
        None, gt=0, description="Maximum completion tokens (spec default 256). Follows "
        "data.data_max_response_length, the one response cap of both trainers and eval "
        "(null); another value is refused.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Ours. Keyword arguments for the chat template (TRL's "
        "chat_template_kwargs). Follows data.data_apply_chat_template_kwargs, which data_prep, "
        "verl and eval use too (null); another value is refused.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Top-p for rollouts; 1.0 keeps all tokens.")
    # GRPO algorithm
    beta: float = Field(
        0.0, ge=0, description="KL penalty coefficient; 0 loads no reference model.")
    epsilon: float = Field(0.5, gt=0, description="Clipping epsilon of the policy ratio.")
    num_iterations: int = Field(3, ge=1, description="Optimisation passes per generated batch "
                                "(mu in the GRPO paper).")
    num_generations: int = Field(
        4, ge=2, description="Completions per prompt. The generation batch (processes x "
        "per_device_train_batch_size x gradient_accumulation_steps) must be divisible by it.")
    # Training
    num_train_epochs: float = Field(4, gt=0, description="Training epochs.")
    max_steps: int = Field(-1, ge=-1, description="Train exactly this many steps when "
                           "positive (overrides num_train_epochs); -1 disables it.")
    per_device_train_batch_size: int = Field(8, gt=0, description="Completions per device "
                                             "per training micro-step.")
    per_device_eval_batch_size: int = Field(8, gt=0, description="Completions per device per "
                                            "evaluation step.")
    gradient_accumulation_steps: int = Field(1, gt=0, description="Micro-steps per optimizer "
                                             "update.")
    learning_rate: float = Field(3e-6, gt=0, description="Peak learning rate.")
    warmup_ratio: float = Field(
        0.1, ge=0, lt=1, description="Fraction of the training steps spent in linear warmup "
        "(TRL's warmup_steps takes a value below 1 as this fraction).")
    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0: off).")
    optim: Literal[OPTIMIZERS] = Field(  # type: ignore[valid-type]
        "adamw_torch", description="Optimizer. lomo/adalomo, grokadamw and schedule_free_sgd "
        "need their optional packages; galore_adamw needs optim_target_modules.")
    lr_scheduler_type: Literal[LR_SCHEDULERS] = Field(  # type: ignore[valid-type]
        "cosine", description="Learning-rate schedule; reduce_lr_on_plateau needs evaluation.")
    # Evaluation
    do_eval: bool = Field(
        False, description="Evaluate on the validation split; true whenever eval_strategy "
        "is not 'no'.")
    eval_strategy: Literal["no", "steps", "epoch"] = Field(
        "no", description="When to evaluate: never, every eval_steps, or every epoch (an "
        "unquoted no, false to YAML, is no).")
    eval_steps: int = Field(1, gt=0, description="Steps between evaluations (strategy steps).")
    # Logging and saving
    logging_steps: float = Field(5, gt=0, description="Steps between log lines (below 1: a "
                                 "fraction of the training steps).")
    save_steps: int = Field(100, gt=0, description="Steps between checkpoints.")
    save_total_limit: int | None = Field(20, gt=0, description="Checkpoints kept (null: all).")
    # Miscellaneous
    shuffle_dataset: bool = Field(True, description="Shuffle the training prompts.")
    use_liger_kernel: bool = Field(
        False, description="Liger kernels (GPU only; ignored on CPU).")
    vllm_gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory vLLM may take (use_vllm; spec "
        "default 0.3). Follows train.verl.rollout_gpu_memory_utilization (null); another "
        "value is refused.")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallel size.")
    deepspeed_config: str | None = Field(
        None, description="Path to a DeepSpeed JSON config (GPU only; ignored on CPU).")

    # ---- Ours, not in the spec: settings the spec leaves to TRL or to the engine.
    lora_rank: int = Field(16, gt=0, description="Ours. LoRA rank (peft r).")
    lora_alpha: int = Field(32, gt=0, description="Ours. LoRA alpha.")
    lora_target_modules: str | list[str] = Field(
        "all-linear", description="Ours. LoRA targets: 'all-linear', a list of module names "
        "or a regex (peft target_modules).")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="Ours. LoRA dropout.")
    loss_type: Literal[LOSS_TYPES] = Field(  # type: ignore[valid-type]
        "dapo", description="Ours. TRL's loss aggregation: dapo (TRL's default: mean over the "
        "tokens of the accumulated batch), grpo (per-sequence mean), dr_grpo, bnpo, cispo, "
        "sapo, luspo (needs sequence-level importance sampling), vespo.")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Ours. Divide advantages by the reward std of the group (TRL's "
        "default), of the whole batch, or not at all (none; Dr. GRPO). true/false mean "
        "group/none, as in TRL.")
    seed: int = Field(42, description="Ours. Seed for the model init, sampling and shuffling.")
    use_vllm: bool = Field(False, description="Ours. Generate with vLLM (GPU, vllm installed).")
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="Ours. vLLM in the training process (colocate) or a separate "
        "`trl vllm-serve` server (server).")
    algorithm_adv_estimator: str = Field(
        "grpo", description="Ours. Advantages: grpo (reward minus the group mean, scaled per "
        "scale_rewards) or reinforce_plus_plus (verl's REINFORCE++: the rewards whitened over the "
        "batch's response tokens, so a response weighs by its length; no per-group baseline).")

    def not_in_effect(self) -> set[str]:
        """Settings of what this run does not do: epochs under max_steps, evaluation without
        an eval strategy, vLLM without use_vllm, LoRA without apply_lora."""
        unused = set()
        if self.max_steps > 0:
            unused.add("num_train_epochs")
        if self.eval_strategy != "steps":
            unused.add("eval_steps")
        if self.eval_strategy == "no":
            unused.add("per_device_eval_batch_size")
        if not self.use_vllm:
            unused |= {"vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size"}
        if not self.apply_lora:
            unused |= {"lora_rank", "lora_alpha", "lora_target_modules", "lora_dropout"}
        return unused

    @field_validator("algorithm_adv_estimator")
    @classmethod
    def _trl_estimators(cls, value: str) -> str:
        if value in TRL_ESTIMATORS:
            return value
        where = ("it runs on the verl engine: set train.engine: verl and "
                 "train.verl.algorithm_adv_estimator" if value in ADV_ESTIMATORS
                 else f"the verl engine has {', '.join(ADV_ESTIMATORS)}")
        raise ValueError(f"the trl engine implements {' and '.join(TRL_ESTIMATORS)}; {where}")

    @field_validator("max_steps")
    @classmethod
    def _steps_or_epochs(cls, value: int) -> int:
        # transformers reads 0 as "by epochs", as it reads -1: refuse the value that looks
        # like "no training" but trains num_train_epochs.
        if value == 0:
            raise ValueError("a positive number of steps, or -1 to train num_train_epochs")
        return value

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_rewards_bool(cls, value: object) -> object:
        # TRL maps True/False to 'group'/'none' in GRPOConfig.__post_init__; do the same.
        if isinstance(value, bool):
            return "group" if value else "none"
        return value

    @field_validator("eval_strategy", mode="before")
    @classmethod
    def _yaml_no(cls, value: object) -> object:
        # YAML 1.1, which Kedro's loader and --params parse, reads an unquoted no as false.
        return "no" if value is False else value

    @field_validator("eval_strategy")
    @classmethod
    def _plateau_needs_eval(cls, value: str, info: ValidationInfo) -> str:
        # transformers raises this when GRPOConfig is built; report it while parsing instead.
        if value == "no" and info.data.get("lr_scheduler_type") == "reduce_lr_on_plateau":
            raise ValueError("lr_scheduler_type 'reduce_lr_on_plateau' needs eval_strategy "
                             "'steps' or 'epoch'")
        return value
