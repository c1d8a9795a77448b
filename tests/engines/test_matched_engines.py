"""conf/cpu trains the same way on both engines: TRL's GRPOConfig and verl's composed config,
built by the real libraries from conf/cpu's parameters, agree on every setting both have
(docs/benchmarks.md, "verl and TRL side by side", says why each one matters)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.config import OmegaConfigLoader
from omegaconf import OmegaConf

from rl_pipeline.engines.trl.config import grpo_config, lora_config
from rl_pipeline.engines.verl.config import (
    compose_verl_config,
    cpu_overrides,
    hydra_overrides,
    spec_values,
)
from rl_pipeline.params import DataParams, resolve_followers
from rl_pipeline.params.train import TrainParams
from rl_pipeline.settings import CONFIG_LOADER_ARGS
from tests.conftest import PROJECT_ROOT


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> tuple:
    loader = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), env="cpu", **CONFIG_LOADER_ARGS)
    params = loader["parameters"]
    train = TrainParams.model_validate(OmegaConf.to_container(OmegaConf.create(
        params["train"])))
    data = DataParams.model_validate(dict(params["data"]))
    trl = resolve_followers({"train": train, "data": data})["train"].trl
    grpo = grpo_config(trl, str(tmp_path_factory.mktemp("trl")), use_cpu=True)
    verl = compose_verl_config(hydra_overrides(spec_values(train.verl, data),
                                               cpu_overrides(1, train.verl.rollout_dtype)))
    return trl, grpo, lora_config(trl), verl


def test_both_engines_sample_the_same_batch_the_same_way(engines) -> None:
    trl, grpo, _, verl = engines
    rollout = verl.actor_rollout_ref.rollout
    assert grpo.num_generations == rollout.n == 4
    assert grpo.per_device_train_batch_size // grpo.num_generations == \
        verl.data.train_batch_size == 3  # prompts per step
    assert grpo.temperature == rollout.temperature == 0.6
    assert grpo.top_p == rollout.top_p == 1.0
    assert rollout.top_k == -1 and grpo.top_k in (None, 0)  # neither truncates
    assert grpo.max_completion_length == verl.data.max_response_length
    assert trl.seed == verl.data.seed == rollout.seed == \
        verl.actor_rollout_ref.actor.fsdp_config.seed


def test_both_engines_take_the_same_steps(engines) -> None:
    _, grpo, _, verl = engines
    actor = verl.actor_rollout_ref.actor
    assert grpo.max_steps == verl.trainer.total_training_steps == 40
    # One update per rollout: TRL's num_iterations 1; verl one epoch of one mini-batch.
    assert grpo.num_iterations == actor.ppo_epochs == 1
    assert actor.ppo_mini_batch_size == verl.data.train_batch_size
    assert grpo.learning_rate == actor.optim.lr == 2e-4
    assert grpo.lr_scheduler_type == actor.optim.lr_scheduler_type == "cosine"
    assert grpo.warmup_steps == actor.optim.lr_warmup_steps_ratio == 0.05  # a ratio below 1
    assert grpo.weight_decay == actor.optim.weight_decay == 0.0
    assert grpo.max_grad_norm == actor.optim.clip_grad == 1.0
    assert grpo.epsilon == actor.clip_ratio_low == actor.clip_ratio_high == 0.5


def test_both_engines_optimise_the_same_loss(engines) -> None:
    _, grpo, _, verl = engines
    actor = verl.actor_rollout_ref.actor
    # No KL term: TRL's beta 0; verl neither in the loss nor in the reward.
    assert grpo.beta == 0.0
    assert actor.use_kl_loss is False and verl.algorithm.use_kl_in_reward is False
    # GRPO advantages: the reward minus the group mean, over the group's standard deviation.
    assert verl.algorithm.adv_estimator == "grpo" and grpo.scale_rewards == "group"
    assert verl.algorithm.norm_adv_by_std_in_grpo is True
    # The loss averaged over every token of the batch.
    assert grpo.loss_type == "dapo" and actor.loss_agg_mode == "token-mean"
    assert actor.entropy_coeff == 0.0


def test_both_engines_train_the_same_adapter_in_float32(engines) -> None:
    _, grpo, lora, verl = engines
    model = verl.actor_rollout_ref.model
    assert lora.r == model.lora_rank == 16 and lora.lora_alpha == model.lora_alpha == 32
    assert lora.target_modules == model.target_modules == "all-linear"
    # TRL trains in float32 on a CPU; verl's actor computes in the rollout's dtype there.
    assert grpo.bf16 is False
    assert verl.actor_rollout_ref.rollout.dtype == "float32"
    assert verl.actor_rollout_ref.actor.fsdp_config.mixed_precision["param_dtype"] == "fp32"
    assert grpo.gradient_checkpointing is True
    assert model.enable_gradient_checkpointing is True


def test_both_engines_drop_out_the_same_adapter(engines, tmp_path) -> None:
    """verl's FSDP engine builds its LoraConfig without dropout (no setting for it): conf/cpu's
    verl run starts from an adapter with TRL's dropout (rl_pipeline.engines.verl.lora)."""
    _, _, lora, _ = engines
    source = Path(__import__("verl.workers.engine.fsdp.transformer_impl",
                             fromlist=["x"]).__file__).read_text()
    assert "lora_dropout" not in source
    loader = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), env="cpu", **CONFIG_LOADER_ARGS)
    verl = TrainParams.model_validate(OmegaConf.to_container(OmegaConf.create(
        loader["parameters"]["train"]))).verl
    assert lora.lora_dropout == verl.actor_model_lora_dropout == 0.05
