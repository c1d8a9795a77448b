"""The verl engine's parameters: every parameter of the verl_trainer_component and rft_trainer
specs, by its spec name, with the spec's default (rft_trainer's where the two differ).

The data files and the model come from the catalog, and the ``data_*`` length and filter
settings from the shared ``data`` group, so they are not repeated here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rl_pipeline.params.base import ParamGroup

ADV_ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
                  "rloo", "opo", "grpo_passk", "gpg")


class VerlParams(ParamGroup):
    """``train.verl``: GRPO, REINFORCE++ and seven more estimators on verl (FSDP, vLLM, LoRA)."""

    group: ClassVar[str] = "train.verl"

    @field_validator("actor_model_target_modules", mode="before")
    @classmethod
    def _yaml_list(cls, value: object) -> object:
        # verl's key takes a Hydra list, written as its override is: '[q_proj,v_proj]'.
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return f"[{','.join(value)}]"
        return value

    @model_validator(mode="before")
    @classmethod
    def _rollout_follows_device(cls, values: Any) -> Any:
        # The device decides the rollout: on a CPU only the transformers rollout runs, so an
        # ENGINE left at the spec's default (vllm) means hf there. Runs before ParamGroup's
        # followers, so rollout_name follows the ENGINE decided here.
        if isinstance(values, Mapping) and values.get("device") == "cpu" \
                and "ENGINE" not in values:
            return {**values, "ENGINE": "hf"}
        return values

    ENGINE: str = Field("vllm", description="Rollout engine (actor_rollout_ref.rollout.name). "
                        "With device: cpu, left unset, it is hf (the transformers rollout).")
    rollout_name: str | None = Field(
        None, description="Rollout engine: follows ENGINE (the same verl key); another value "
        "is refused.")
    data_train_batch_size: int = Field(512, gt=0, description="Prompts per training step.")
    # Algorithm
    algorithm_adv_estimator: Literal[ADV_ESTIMATORS] = Field(  # type: ignore[valid-type]
        "grpo", description="Advantage estimator; gae also trains a critic.")
    algorithm_use_kl_in_reward: bool = Field(False, description="KL penalty in the reward.")
    # Actor
    actor_optim_lr: float = Field(3e-6, gt=0, description="Actor learning rate.")
    actor_model_use_remove_padding: bool = Field(True, description="Sequence packing.")
    actor_strategy: Literal["fsdp", "fsdp2"] = Field("fsdp2", description="FSDP version.")
    actor_fsdp_config_offload_policy: bool = Field(
        True, description="FSDP2 CPU offload policy (fsdp2 only).")
    actor_ppo_mini_batch_size: int = Field(
        128, gt=0, description="PPO mini-batch, in prompts (verl_trainer_component name).")
    actor_rft_mini_batch_size: int | None = Field(
        None, gt=0, description="rft_trainer's name for actor_ppo_mini_batch_size: follows it; "
        "another value is refused.")
    actor_ppo_micro_batch_size_per_gpu: int = Field(
        10, gt=0, description="Sequences per GPU per forward/backward.")
    actor_rft_micro_batch_size_per_gpu: int | None = Field(
        None, gt=0, description="rft_trainer's name for actor_ppo_micro_batch_size_per_gpu: "
        "follows it; another value is refused.")
    actor_model_lora_rank: int = Field(64, ge=0, description="LoRA rank; 0 trains all weights.")
    actor_model_lora_alpha: int = Field(32, gt=0, description="LoRA alpha.")
    actor_model_target_modules: str = Field(
        "all-linear", description="LoRA targets: all-linear, a list '[q_proj,v_proj]' (or a "
        "YAML list) or a regex.")
    actor_model_exclude_modules: str | None = Field(
        ".*visual.*", description="Regex of modules LoRA leaves alone.")
    actor_use_kl_loss: bool = Field(True, description="KL to the reference in the actor loss.")
    actor_kl_loss_coef: float = Field(0.01, ge=0, description="KL loss coefficient.")
    actor_kl_loss_type: Literal["low_var_kl", "kl", "abs", "mse"] = Field(
        "low_var_kl", description="KL estimator.")
    actor_entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    actor_model_enable_gradient_checkpointing: bool = Field(True, description="Recompute "
                                                            "activations in backward.")
    actor_fsdp_param_offload: bool = Field(False, description="Offload actor params to CPU.")
    actor_fsdp_optimizer_offload: bool = Field(False, description="Offload optimizer state.")
    # Rollout
    rollout_log_prob_micro_batch_size_per_gpu: int = Field(20, gt=0, description="Log-prob "
                                                           "micro-batch per GPU.")
    rollout_tensor_model_parallel_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        2, description="vLLM tensor parallel size; auto: min(2, GPUs per node).")
    rollout_dtype: Literal["float16", "bfloat16", "float32", "auto"] = Field(
        "bfloat16", description="Rollout dtype.")
    rollout_disable_mm_preprocessor_cache: bool = Field(
        True, description="Disable vLLM's multimodal preprocessor cache.")
    rollout_gpu_memory_utilization: float = Field(0.6, gt=0, le=1, description="vLLM memory.")
    rollout_enable_chunked_prefill: bool = Field(False, description="vLLM chunked prefill.")
    rollout_enforce_eager: bool = Field(False, description="Disable CUDA graphs in vLLM.")
    rollout_free_cache_engine: bool = Field(False, description="Free the KV cache between "
                                            "rollouts.")
    rollout_n: int = Field(5, ge=1, description="Responses per prompt (>1 for group methods).")
    rollout_temperature: float = Field(1.0, ge=0, description="Rollout temperature.")
    rollout_top_p: float = Field(1.0, gt=0, le=1, description="Rollout top-p.")
    rollout_top_k: int = Field(-1, ge=-1, description="Rollout top-k; -1 disables it.")
    rollout_do_sample: bool = Field(True, description="Sample (true) or greedy (false).")
    rollout_val_temperature: float = Field(0.7, ge=0, description="Validation temperature.")
    rollout_val_top_p: float = Field(0.7, gt=0, le=1, description="Validation top-p.")
    rollout_val_top_k: int = Field(-1, ge=-1, description="Validation top-k.")
    # Reference policy
    ref_log_prob_micro_batch_size_per_gpu: int = Field(20, gt=0, description="Reference "
                                                       "log-prob micro-batch per GPU.")
    ref_fsdp_param_offload: bool = Field(True, description="Offload reference params to CPU.")
    # Trainer
    trainer_critic_warmup: int = Field(0, ge=0, description="Critic-only steps first.")
    trainer_n_gpus_per_node: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        8, description="GPUs per node; auto: the GPUs visible here.")
    trainer_nnodes: int = Field(1, ge=1, description="Nodes (more than 1 needs a Ray cluster).")
    trainer_save_freq: int = Field(20, description="Checkpoint every N steps, and the last "
                                   "(verl's -1, never, is refused: the train stage exports "
                                   "the last checkpoint).")
    trainer_test_freq: int = Field(5, description="Validate every N steps (-1: never).")
    trainer_val_before_train: bool = Field(True, description="Validate before training.")
    trainer_total_epochs: int = Field(7, ge=1, description="Epochs.")
    total_training_steps: int | None = Field(None, gt=0, description="Steps; overrides epochs "
                                             "(verl is given as many as the steps need).")
    # Ours, not the specs'.
    actor_model_lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="LoRA dropout (peft's lora_dropout). verl's FSDP engine "
        "has no setting for it; above 0 the run starts from a freshly initialised adapter "
        "with this dropout, which verl loads through its actor_rollout_ref.model."
        "lora_adapter_path (rl_pipeline.engines.verl.lora). Needs actor_model_lora_rank > 0. "
        "The masks fall on a step's samples in the order of their tokens, the same every run "
        "(rl_pipeline.engines.verl.trainer.in_content_order).")
    actor_optim_lr_scheduler_type: Literal["constant", "cosine"] = Field(
        "constant", description="Learning-rate schedule after the warm-up (verl's FSDP engine "
        "has these two; cosine decays to 0 at the last step).")
    actor_optim_lr_warmup_steps_ratio: float = Field(
        0.0, ge=0, lt=1, description="Share of the steps spent warming the learning rate up "
        "from 0.")
    actor_optim_weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    actor_clip_ratio: float = Field(
        0.2, gt=0, description="PPO clip of the importance ratio, both sides (verl's "
        "clip_ratio_low and clip_ratio_high; TRL's epsilon).")
    seed: int = Field(
        42, description="Seed of the data order (data.seed), the rollout's sampling "
        "(rollout.seed: vLLM's with full determinism, the CPU rollout's always) and the "
        "engine (actor fsdp_config.seed: the LoRA initialisation on a CPU, everything under "
        "verl's full determinism).")
    trainer_max_actor_ckpt_to_keep: int | None = Field(
        None, gt=0, description="Checkpoints verl keeps (the newest; null: every one, verl's "
        "default). A LoRA checkpoint holds the full model state in fp32 plus the optimizer "
        "state, so each is about 4 bytes per model parameter: preflight checks that the kept "
        "ones, and merge's copies, fit the free disk.")
    gpu_memory_gib: Annotated[float, Field(gt=0)] | Literal["auto"] | None = Field(
        "auto", description="Memory of one GPU, for preflight's estimate of a step's "
        "worst case (every sequence at the prompt and response caps: vLLM's share, the "
        "actor's packed micro-batches with their quadratic attention mask, the logits). "
        "auto: read from the GPU when training on this machine, not checked otherwise; "
        "null: not checked.")
    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="Where verl's workers run. cuda: GPUs, with the vLLM rollout. cpu: "
        "this machine's CPU, with the transformers rollout (ENGINE follows: hf): verl's own "
        "trainer, agent loop, reward loop, FSDP2 + LoRA update, weight sync and checkpoints, "
        "for small models and short runs (docs/gpu.md, 'verl on a CPU'); "
        "trainer_n_gpus_per_node then counts ranks on gloo (auto: 1).")
    rollout_max_probs_diff: float | None = Field(
        0.05, gt=0, le=1, description="After training, verl's own rollout-versus-actor metric "
        "training/rollout_probs_diff_mean (mean |p_rollout - p_actor| over response tokens) "
        "must stay at or below this at every step, else the run fails naming the likely "
        "causes (a LoRA adapter the rollout never loaded, weights garbled by the sync): the "
        "rollout sampled another policy than the one trained. null: not checked.")
    rollout_min_probs_pearson: float | None = Field(
        0.9, ge=-1, le=1, description="The same check on verl's "
        "training/rollout_actor_probs_pearson_corr: at least this at every step. With the "
        "same weights it stays near 1 (0.985-0.999 measured on a CPU, docs/gpu.md); a rollout "
        "without the trained adapter fell to 0.37 one step later. null: not checked.")
    actor_model_attn_implementation: Literal["sdpa", "flash_attention_2", "eager"] = Field(
        "sdpa", description="Attention kernel of the actor, reference and critic (verl's "
        "model override_config). sdpa is PyTorch's own and needs nothing installed; verl's "
        "default flash_attention_2 needs the flash-attn package (built from source) and is "
        "refused by preflight where it is not importable.")
    overrides: list[str] = Field(
        default_factory=list, description="Further verl Hydra overrides ('key=value', "
        "'+new.key=value'), composed and validated like the rest; keys that a spec parameter "
        "or the catalog sets are refused (set those instead).")
    pypi_packages_override: str | None = Field(
        None, description="Comma-separated requirement specifiers installed into the Ray "
        "workers' environment (runtime_env pip), e.g. 'transformers==5.10.4'.")
