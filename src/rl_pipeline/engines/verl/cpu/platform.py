"""verl's device platform for the host CPU, registered with verl's ``PlatformRegistry`` on
import and chosen in every Ray process by ``VERL_PLATFORM=cpu`` (``config.CPU_ENV``).

verl's worker modules read the device when they are imported, so this module is imported
before any of them (the package's ``__init__`` says the order).
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
