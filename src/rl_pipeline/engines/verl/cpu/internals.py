"""What the CPU mode takes from verl beyond its documented hooks, and the check that the
installed verl still has it (tests/engines/verl/test_cpu.py), so that a verl upgrade that
moves one fails loudly instead of silently running another code path."""

from __future__ import annotations

import inspect

from verl.trainer.ppo.v1 import trainer_base
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout import base as rollout_base

from rl_pipeline.engines.verl.trainer import check_trainer_internals

# What the CPU mode takes from verl beyond its documented hooks, beside the trainer's
# (rl_pipeline.engines.verl.trainer.VERL_INTERNALS): (what, why).
VERL_INTERNALS = (
    ("verl.workers.rollout.base._ROLLOUT_REGISTRY", "the worker looks its rollout adapter up "
     "there and nowhere else (no register function in 0.9.1)"),
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer._init_resource_pool_mgr", "where the sync "
     "trainer hard-wires ActorRolloutRefWorker"),
    ("verl.workers.engine_workers.ActorRolloutRefWorker.update_weights", "calls the rollout "
     "adapter's update_weights(weights, peft_config=, base_sync_done=, global_steps=)"),
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_old_log_prob", "the step's old "
     "log-probabilities are in the TransferQueue when it returns (hf_rollout.agreement_dir)"),
)


def check_verl_internals() -> list[str]:
    """What of :data:`VERL_INTERNALS` and the trainer's the installed verl no longer has
    (empty: all there)."""
    missing = check_trainer_internals()
    if not isinstance(getattr(rollout_base, "_ROLLOUT_REGISTRY", None), dict):
        missing.append(VERL_INTERNALS[0][0])
    pool_source = inspect.getsource(trainer_base.PPOTrainer._init_resource_pool_mgr)
    if "ray.remote(ActorRolloutRefWorker)" not in pool_source:
        missing.append(VERL_INTERNALS[1][0])
    sync_source = inspect.getsource(ActorRolloutRefWorker.update_weights)
    if "peft_config=peft_config, base_sync_done=True" not in sync_source:
        missing.append(VERL_INTERNALS[2][0])
    old_source = inspect.getsource(trainer_base.PPOTrainer._compute_old_log_prob)
    if '"old_log_probs"' not in old_source or "kv_batch_put" not in old_source:
        missing.append(VERL_INTERNALS[3][0])
    return missing
