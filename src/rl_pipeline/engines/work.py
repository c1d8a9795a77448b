"""A run's work, described alike for every engine: what the forecast of its time and cost
(:mod:`rl_pipeline.engines.forecast`) multiplies. Each engine fills a :class:`StepWork` from
its resolved configuration in its preflight; eval's comes from the ``eval`` group."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rl_pipeline.evaluation.generate import SamplingSettings


@dataclass(frozen=True)
class StepWork:
    """What every training step of a run does, and how often."""

    engine: str
    steps: int                  # training steps this configuration trains
    prompts: int                # prompts per step
    completions: int            # completions per prompt
    response_cap: int           # response tokens at most
    rollouts_per_step: float    # generation batches per step (TRL reuses one num_iterations
    #                             times: 1/num_iterations)
    log_prob_passes: float      # forward passes over the batch per step besides the update
    #                             (verl's old log-probs, a reference model's)
    update_passes: float        # forward and backward passes over the batch per step
    recompute: bool             # gradient checkpointing: one forward more per update pass
    temperature: float
    top_p: float
    top_k: int                  # -1: none
    seed: int
    dtype: str                  # the precision it trains in on a CPU
    lora: dict[str, Any] | None  # peft LoraConfig's r, lora_alpha, target_modules
    device: str                 # cpu or cuda
    devices: int                # ranks: GPUs over all nodes (on a CPU, gloo ranks)
    tensor_parallel: int        # GPUs per rollout replica
    saves: int                  # checkpoints written
    checkpoint_gib: float       # one checkpoint on disk
    checkpoints_kept: int
    model_gib: float            # the base model's weights on disk (merge writes two copies)
    validations: int = 0        # validation passes during training (verl's test_freq)
    validation_prompts: int = 0
    gpu_peak_gib: float | None = None  # the engine's own worst case per GPU, where it has one
    rollout_backend: str = "hf"  # what generates on a GPU: vllm, or hf (transformers' generate)

    @property
    def sequences(self) -> int:
        return self.prompts * self.completions

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EvalWork:
    """What eval generates: every model (base and trained) on every eval prompt."""

    prompts: int
    sampling: SamplingSettings
    batch_size: int
    dtype: str
    models: int = 2
    backend: str = "hf"  # vllm or hf, resolved (eval.backend's auto decided)

    @property
    def batches(self) -> int:
        return -(-self.prompts // self.batch_size)
