"""verl's own trainer on a CPU, through verl's extension points (verl's files unchanged).

verl 0.9.1 has no CPU device platform and no rollout without vLLM or SGLang (docs/gpu.md,
"verl on a CPU"). This module supplies the platform and, through
:mod:`rl_pipeline.engines.verl.hf_rollout` (imported here), the rollout, so that ``run_ppo``
runs verl's real driver, TaskRunner, trainer loop, agent loop, reward loop, advantage, FSDP2
+ LoRA actor update, weight sync and checkpoint manager on a machine without a GPU:

- :class:`CPUPlatform`, registered with verl's ``PlatformRegistry`` and chosen in every Ray
  process by ``VERL_PLATFORM=cpu`` (``config.CPU_ENV``, set in Ray's runtime_env);
- :class:`CPUActorRolloutRefWorker`, verl's hybrid worker with a gloo process group created
  before verl would create ``cpu:gloo,cpu:gloo`` (which torch refuses);
- the transformers rollout (``rollout.name: hf``) of :mod:`~rl_pipeline.engines.verl.hf_rollout`,
  on this CPU.

The trainer and TaskRunner that put that worker where verl's sync trainer hard-wires its
own are in :mod:`rl_pipeline.engines.verl.cpu_trainer` (verl's plugin hook imports this
module inside ``import verl``; that one imports verl's trainer).

Everything here that leans on verl's internals is listed in :data:`VERL_INTERNALS` and
checked by :func:`check_verl_internals` (tests/engines/verl/test_cpu.py), so that a verl
upgrade that moves one fails loudly instead of silently running another code path.

The platform is defined and registered before anything below imports verl's workers:
those modules read the device at import time, and ``VERL_PLATFORM=cpu`` must then resolve.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM = "cpu"


def _device_module() -> types.SimpleNamespace:
    """``torch.cpu`` plus the CUDA-only calls verl makes through ``get_torch_device()``
    (the list: ``grep -rhoE "get_torch_device\\(\\)\\.\\w+"`` over verl's source)."""
    import psutil

    module = types.SimpleNamespace(**{name: getattr(torch.cpu, name) for name in dir(torch.cpu)
                                      if not name.startswith("_")})

    def zero(*_args: Any, **_kwargs: Any) -> int:
        return 0

    def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    def mem_get_info(*_args: Any) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    module.__dict__.update(
        empty_cache=nothing, ipc_collect=nothing, set_per_process_memory_fraction=nothing,
        reset_peak_memory_stats=nothing, memory_allocated=zero, memory_reserved=zero,
        max_memory_allocated=zero, max_memory_reserved=zero, mem_get_info=mem_get_info,
        get_device_name=lambda *_args: "CPU", manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed, get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state)
    return module


@PlatformRegistry.register(platform=PLATFORM)
class CPUPlatform(PlatformBase):
    """The host CPU as verl's accelerator: device ``"cpu"``, collectives on gloo.

    Ray still places verl's workers on a logical GPU (``ray_resource_name`` stays ``GPU``):
    verl's resource pools always ask for one, and ``config.cpu_overrides``' Ray declares
    it. The device is the string ``"cpu"``, because verl passes ``current_device()`` to
    ``.to()`` and ``torch.device()``, where a CPU build refuses an integer.
    """

    _module: types.SimpleNamespace | None = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.SimpleNamespace:
        if CPUPlatform._module is None:
            CPUPlatform._module = _device_module()
        return CPUPlatform._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it, so GPU runs cannot.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


# verl's worker and trainer modules, imported once the platform can resolve.
from verl.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from verl.workers.rollout import base as rollout_base  # noqa: E402

# The rollout registers itself with verl on import. A module import, not a name: a process
# whose first import is hf_rollout (Ray unpickling an HFServer) comes back here through
# verl's plugin hook while hf_rollout is still half-initialised.
from rl_pipeline.engines.verl import hf_rollout  # noqa: E402

# What this module takes from verl beyond its documented hooks, beside the trainer's
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
    import inspect

    from verl.trainer.ppo.v1 import trainer_base

    from rl_pipeline.engines.verl.trainer import check_trainer_internals

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


def _init_gloo() -> None:
    """The process group verl would create, on gloo alone, from the env verl's Ray sets."""
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="gloo", rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)))


class CPUActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid worker (actor, rollout adapter, reference) with a gloo process group.

    The LoRA adapter's random initialisation draws from the engine's seed
    (``actor.fsdp_config.seed``, ``train.verl.seed``): verl seeds it only under full
    determinism, which a CPU run does not need for that.
    """

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        _init_gloo()
        hf_rollout.use_every_core()
        torch.manual_seed(int(config.actor.fsdp_config.get("seed", 42)))
        super().__init__(config, *args, **kwargs)
