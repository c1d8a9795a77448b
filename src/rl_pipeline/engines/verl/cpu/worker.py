"""verl's hybrid worker on a CPU, with the transformers rollout registered with verl.

Imported after :mod:`~rl_pipeline.engines.verl.cpu.platform` (the package's ``__init__``):
verl's worker modules resolve the device at import time.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from verl.workers.engine_workers import ActorRolloutRefWorker

# The rollout registers itself with verl on import. A module import, not a name: a process
# whose first import is hf_rollout (Ray unpickling an HFServer) comes back here through
# verl's plugin hook while hf_rollout is still half-initialised.
from rl_pipeline.engines.verl import hf_rollout


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
