"""verl's driver (``run_ppo``) on a local Ray that cannot place its workers.

verl waits for its workers' placement groups without a time limit. Here the local Ray that
verl starts has a GPU but too few CPUs left beside verl's TaskRunner and TransferQueue
actors for the worker bundle (3 CPUs and the GPU): Ray keeps the group pending, as it would
with a GPU another job holds. The run must stop after ``train.ray_placement_timeout_s``
with a message saying what could not be placed and what the node has, and the Ray it
started must be shut down (merge and eval run next in the same process and need the GPUs).
tests/gpu_boundary/test_ray_cluster_run.py runs the driver on to the workers' device
initialisation, on two nodes.
"""

from __future__ import annotations

import time

import pytest

from rl_pipeline.engines.verl.engine import WorkerPlacementError, train_verl
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.verl_inputs import SMALL

pytestmark = [pytest.mark.gpu_boundary, pytest.mark.slow]

# verl's default TransferQueue layout (8 storage actors) would take the CPUs first. A Ray of
# its own: ray.init() would join the last `ray start`-style cluster on this machine (the
# head of tests/gpu_boundary/test_ray_cluster_run.py leaves its address in Ray's temp dir).
LOCAL_RAY = ["+ray_kwargs.ray_init.address=local",
             "+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=4",
             "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
             "trainer.val_before_train=false", "+ray_kwargs.ray_init.include_dashboard=false"]
TIMEOUT_S = 5


def test_workers_ray_cannot_place_stop_the_run_in_bounded_time_and_ray_is_shut_down(
        inputs) -> None:
    import ray

    verl = VerlParams(**{**SMALL, "actor_model_lora_rank": 0, "trainer_total_epochs": 1})
    plan = plan_verl(verl, DataParams(), RewardParams(), inputs, gpus_visible=0,
                     training=False, train_rows=16)
    started = time.monotonic()
    with pytest.raises(WorkerPlacementError) as failure:
        train_verl([*plan.overrides, *LOCAL_RAY], run_id=None, placement_timeout_s=TIMEOUT_S)
    message = str(failure.value)
    assert f"not placed on the Ray cluster within {TIMEOUT_S} s" in message, message
    assert "1 bundle(s) of 1 GPU, 3 CPU on one node" in message
    assert "has 1 GPU, 4 CPU" in message  # what the node has, beside what was asked
    assert "TaskPlacementGroupRemoved" in repr(failure.value.__cause__)  # verl's wait ended
    assert time.monotonic() - started < TIMEOUT_S + 120
    assert not ray.is_initialized()
