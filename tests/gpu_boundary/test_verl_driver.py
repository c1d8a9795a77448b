"""verl's driver (``run_ppo``) on a local Ray cluster that declares a GPU it does not have.

verl cannot train on a CPU, but everything up to the workers' first collective runs: Ray
starts, the TaskRunner composes its trainer, TransferQueue starts, the resource pool is
granted the declared GPU and the FSDP workers start. They stop at NCCL, which a CPU build of
torch lacks. That our launch gets that far, and that Ray is shut down afterwards (so that
merge and eval, which run next in the same process, get the GPUs back), is checked here.
"""

from __future__ import annotations

import pytest

from rl_pipeline.config import DataParams, RewardParams
from rl_pipeline.engines.verl_engine import plan_verl, train_verl
from rl_pipeline.engines.verl_params import VerlParams
from tests.engines.test_verl_engine import SMALL, inputs  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu_boundary, pytest.mark.slow]

# A CPU cannot host verl's default TransferQueue layout (8 storage actors) on 2 cores.
LOCAL_CLUSTER = ["+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=6",
                 "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
                 "trainer.val_before_train=false", "+ray_kwargs.ray_init.include_dashboard=false"]


def test_the_driver_reaches_the_gpu_workers_and_ray_is_shut_down(inputs) -> None:  # noqa: F811
    import ray

    verl = VerlParams(**{**SMALL, "actor_model_lora_rank": 0, "trainer_total_epochs": 1})
    plan = plan_verl(verl, DataParams(), RewardParams(), inputs, gpus_visible=0,
                     training=False, train_rows=16)
    with pytest.raises(Exception) as failure:
        train_verl([*plan.overrides, *LOCAL_CLUSTER], run_id=None)
    assert "NCCL" in str(failure.value), str(failure.value)[-3000:]
    assert not ray.is_initialized()
