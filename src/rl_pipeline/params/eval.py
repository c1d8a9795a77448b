"""The ``eval`` group: base model against trained model."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rl_pipeline.params.base import ParamGroup


class EvalParams(ParamGroup):
    """Evaluation of the base and the trained model (the ``eval`` group)."""

    group: ClassVar[str] = "eval"

    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto", description="Generation back end: 'hf' (transformers generate, CPU or GPU), "
        "'vllm' (offline engine, GPU), 'auto' (vllm when installed with CUDA, else hf).")
    max_prompts: int | None = Field(
        None, gt=0, description="Evaluate the first N validation prompts (null: all): a "
        "quick check, which the promotion gate does not take as evidence.")
    n_samples: int = Field(
        1, ge=1, description="Samples per prompt (n): mean@n, and pass@k and maj@k for the k "
        "of pass_k up to n.")
    pass_k: list[int] = Field(
        default_factory=lambda: [1, 4, 8], min_length=1,
        description="The k of pass@k (unbiased estimator) and maj@k (majority vote over the "
        "answers of the first k samples). A k above the samples per prompt (n_samples; 1 "
        "when greedy) is skipped, and the report says so.")
    correct_reward: float | None = Field(
        None, description="A sample counts as correct for pass@k and maj@k when the reward "
        "is at least this. Follows reward.correct_score (null); another value is refused.")
    bootstrap_resamples: int = Field(
        10_000, ge=100, description="Resamples of the paired bootstrap over prompts that "
        "gives every base-versus-trained delta its 95% interval (seeded by eval.seed).")
    greedy: bool = Field(False, description="Greedy decoding (one sample per prompt).")
    rollout_val_temperature: float | None = Field(
        None, ge=0, description="Sampling temperature. Follows the spec's "
        "train.verl.rollout_val_temperature (null); another value is refused.")
    rollout_val_top_p: float | None = Field(
        None, gt=0, le=1, description="Top-p. Follows the spec's train.verl.rollout_val_top_p "
        "(null); another value is refused.")
    rollout_val_top_k: int | None = Field(
        None, ge=-1, description="Top-k, -1 disabled. Follows the spec's "
        "train.verl.rollout_val_top_k (null); another value is refused.")
    max_new_tokens: int | None = Field(
        None, gt=0, description="Cap on response tokens. Follows data.data_max_response_length "
        "(null); another value is refused.")
    batch_size: int = Field(32, ge=1, description="Prompts per generate call (hf back end).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Model dtype; auto: bfloat16 on GPU, float32 on CPU.")
    vllm_gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory vLLM may take (vllm back end). "
        "Follows train.verl.rollout_gpu_memory_utilization (null); another value is refused.")
    seed: int = Field(42, description="Sampling seed, and the bootstrap's.")

    @property
    def samples(self) -> int:
        """Samples per prompt: one when greedy, else n_samples."""
        return samples_per_prompt(self.n_samples, self.greedy)

    def not_in_effect(self) -> set[str]:
        """Greedy decoding draws one answer per prompt, whatever the sampling settings."""
        return set(_SAMPLING) if self.greedy else set()

    @model_validator(mode="after")
    def _positive_k(self) -> EvalParams:
        if any(k < 1 for k in self.pass_k):
            raise ValueError(f"eval.pass_k={self.pass_k}: every k must be at least 1")
        return self


_SAMPLING = ("n_samples", "rollout_val_temperature", "rollout_val_top_p", "rollout_val_top_k")


def samples_per_prompt(n_samples: int, greedy: bool) -> int:
    """What eval generates per prompt: greedy decoding has one answer."""
    return 1 if greedy else n_samples
