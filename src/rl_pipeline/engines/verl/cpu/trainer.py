"""verl's sync trainer and TaskRunner for the CPU mode (``train.verl.device: cpu``).

Not imported by the package's ``__init__``, which verl's plugin hook imports inside ``import
verl`` in every Ray process: this one imports verl's trainer (which imports verl). The
platform first, then the trainer, never the other way round.
"""

from __future__ import annotations

from typing import Any

import ray

# The package (the CPU platform) is imported, and registered, before verl's trainer below.
from rl_pipeline.engines.verl.cpu.worker import CPUActorRolloutRefWorker
from rl_pipeline.engines.verl.hf_rollout import AGREEMENT_FIELDS, custom_settings, save_agreement
from rl_pipeline.engines.verl.trainer import PipelinePPOTrainerSync, PipelineTaskRunnerBase


class CPUPPOTrainerSync(PipelinePPOTrainerSync):
    """verl's v1 sync trainer (as the pipeline runs it) with :class:`CPUActorRolloutRefWorker`
    in its worker roles; with ``hf_rollout.agreement_dir`` it records each step's tokens and
    both sides' log-probabilities (:mod:`rl_pipeline.engines.verl.agreement`)."""

    def _init_resource_pool_mgr(self) -> None:
        from verl.trainer.ppo.utils import Role

        super()._init_resource_pool_mgr()
        for role in (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef, Role.RefPolicy):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(CPUActorRolloutRefWorker)

    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        batch = super()._compute_old_log_prob(batch, metrics)
        folder = custom_settings(self.config.actor_rollout_ref.rollout).get("agreement_dir")
        if folder:  # the tokens and both sides' log-probabilities, for agreement_report
            import transfer_queue as tq

            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=AGREEMENT_FIELDS)
            save_agreement(folder, f"step_{self.global_steps}",
                           {key: [row.clone() for row in data[key].unbind()]
                            for key in AGREEMENT_FIELDS})
        return batch


@ray.remote
class CPUTaskRunner(PipelineTaskRunnerBase):
    """verl's v1 TaskRunner, building :class:`CPUPPOTrainerSync`."""

    trainer_class = CPUPPOTrainerSync



