"""verl's own trainer on a CPU, through verl's extension points (verl's files unchanged).

verl 0.9.1 has no CPU device platform and no rollout without vLLM or SGLang (docs/gpu.md,
"verl on a CPU"). This package supplies them, so that ``run_ppo`` runs verl's real driver,
TaskRunner, trainer loop, agent loop, reward loop, advantage, FSDP2 + LoRA actor update,
weight sync and checkpoint manager on a machine without a GPU. Its layout is its load order:

1. :mod:`.platform`: :class:`CPUPlatform`, registered with verl's ``PlatformRegistry`` and
   chosen in every Ray process by ``VERL_PLATFORM=cpu`` (``config.CPU_ENV``). First, because
   verl's worker modules read the device when they are imported.
2. :mod:`.worker`: :class:`CPUActorRolloutRefWorker`, verl's hybrid worker with a gloo process
   group created before verl would create ``cpu:gloo,cpu:gloo`` (which torch refuses), and
   the transformers rollout (``rollout.name: hf``, :mod:`rl_pipeline.engines.verl.hf_rollout`)
   registered with verl.

verl's plugin hook (``VERL_USE_EXTERNAL_MODULES``) imports this package inside ``import verl``
in every Ray process, so it imports only those two. Not imported here:

- :mod:`.trainer`: the trainer and TaskRunner that put the worker where verl's sync trainer
  hard-wires its own; it imports verl's trainer, which imports verl (the engine imports it
  once verl is loaded).
- :mod:`.internals`: what the CPU mode takes from verl beyond its documented hooks, and the
  check that the installed verl still has it.
"""

# In this order (platform, then worker). Importing .worker alone runs this file first, so
# the platform is always registered before verl's workers are imported.
from rl_pipeline.engines.verl.cpu import platform, worker  # noqa: F401
