"""verl's own trainer on a CPU, through verl's extension points (verl's files unchanged).

verl 0.9.1 has no CPU device platform and no CPU rollout (docs/gpu.md, "verl on a CPU").
This module supplies both, so that ``run_ppo`` runs verl's real driver, TaskRunner, trainer
loop, agent loop, reward loop, advantage, FSDP2 + LoRA actor update, weight sync and
checkpoint manager on a machine without a GPU:

- :class:`CPUPlatform`, registered with verl's ``PlatformRegistry`` and chosen in every Ray
  process by ``VERL_PLATFORM=cpu`` (``config.CPU_ENV``, set in Ray's runtime_env);
- :class:`CPUActorRolloutRefWorker`, verl's hybrid worker with a gloo process group created
  before verl would create ``cpu:gloo,cpu:gloo`` (which torch refuses);
- an HF-transformers rollout: :class:`HFReplica` (verl's public ``RolloutReplicaRegistry``)
  with one :class:`HFServer` actor per replica, and :class:`HFServerAdapter`, the worker
  side that verl's naive weight sync calls. LoRA travels as on the GPU path: the base
  weights once, then the adapter every step, loaded into a PEFT model, never merged.

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
from dataclasses import dataclass
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM = "cpu"
ROLLOUT = "hf"
# The rollout server's batches: requests that arrive within the window join one batch.
BATCH_WINDOW_S = 0.02
MAX_BATCH = 32
# The worker-side rollout adapter, by the dotted path verl's private registry stores.
ADAPTER_PATH = f"{__name__}.HFServerAdapter"


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
import ray  # noqa: E402
from verl.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from verl.workers.rollout import base as rollout_base  # noqa: E402
from verl.workers.rollout.base import BaseRollout  # noqa: E402
from verl.workers.rollout.replica import (  # noqa: E402
    RolloutReplica,
    RolloutReplicaRegistry,
    TokenOutput,
)

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
     "log-probabilities are in the TransferQueue when it returns (cpu_rollout.agreement_dir)"),
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


def use_every_core() -> None:
    """Compute with every core of this machine's share, not Ray's one thread.

    Ray sets an actor's OMP_NUM_THREADS to its CPU count (a fraction here, so 1); the
    sync trainer runs the actor and the rollout server in turn, never together, so each
    may have the whole machine while it works.
    """
    torch.set_num_threads(len(os.sched_getaffinity(0)))


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
        use_every_core()
        torch.manual_seed(int(config.actor.fsdp_config.get("seed", 42)))
        super().__init__(config, *args, **kwargs)


# What cpu_rollout.agreement_dir records of each step (rl_pipeline.engines.verl.agreement).
AGREEMENT_FIELDS = ["prompts", "responses", "response_mask", "rollout_log_probs",
                    "old_log_probs"]


def save_agreement(folder: str, name: str, record: dict[str, Any]) -> None:
    """One record of ``cpu_rollout.agreement_dir``: ``step_N`` (a step's batch) or
    ``adapter_N`` (the adapter the rollout loaded after step N; 0: before training)."""
    from rl_pipeline.staging import staged

    with staged(os.path.join(folder, f"{name}.pt")) as path:
        torch.save(record, path)


def custom_settings(config: Any) -> dict[str, Any]:
    """``rollout.custom.cpu_rollout``: the CPU rollout's own settings."""
    custom = getattr(config, "custom", None) or {}
    return dict(custom.get("cpu_rollout", {}) or {})


@dataclass
class _Request:
    """One ``generate`` call waiting for its batch."""

    prompt_ids: list[int]
    params: dict[str, Any]
    future: Any  # asyncio.Future[TokenOutput]


class HFServer:
    """One rollout server: a transformers model on this CPU, answering verl's token-in,
    token-out ``generate`` with the log-probabilities verl compares with the actor's.

    verl's agent loop sends every sample of a step as its own request, all at once; the
    server gathers the requests that arrive together and generates them as one batch, then
    answers each (SmolLM2's 8 samples of a step: 3-4 s as one batch, 12 s one by one).

    The model computes in the rollout's dtype (``rollout.dtype``), which the CPU mode also
    gives the actor (``config.cpu_overrides``): the rollout samples the very policy the
    actor trains, token probabilities equal up to summation order (docs/gpu.md). Sampling
    draws from ``rollout.seed`` (plus the replica's rank), as vLLM's does.

    The base weights come from the model folder, then from the actor (verl's first weight
    sync); with LoRA the adapter arrives every step and is loaded into a PEFT model, as
    vLLM's ``add_lora`` does on the GPU path. ``cpu_rollout.sync_adapter: false`` (in
    ``actor_rollout_ref.rollout.custom``) drops the adapter on arrival, as vLLM does when it
    is not listed: a sabotage that the rollout-policy check must catch.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        self.config = config
        self.replica_rank = replica_rank
        self.sync_adapter = bool(custom_settings(config).get("sync_adapter", True))
        self.max_batch = int(custom_settings(config).get("max_batch", MAX_BATCH))
        # A diagnostic: sample with the adapter's dropout on, as TRL's GRPOTrainer does (its
        # model stays in training mode while it generates). The rollout then samples another
        # policy than the actor's, which the rollout-policy check reports.
        self.sample_with_dropout = bool(custom_settings(config).get("sample_with_dropout",
                                                                    False))
        self.dtype = compute_dtype(config.dtype)
        self.global_steps: int | None = None
        self.adapter_steps: list[int | None] = []  # the steps whose adapter was loaded
        self.pending: list[_Request] = []
        self.server_task: Any = None
        # Every tensor operation runs on this one thread. Once a second thread of a
        # process computes with torch, both compute at about half speed here (OpenMP
        # thread teams competing for 2 cores: a batch of 8 took 5.3 s instead of 3.2 s).
        self.torch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-rollout")
        path = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig).local_path
        self.torch_thread.submit(self._load_model, path, replica_rank).result()

    def _load_model(self, path: str, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM

        use_every_core()
        torch.manual_seed(int(getattr(self.config, "seed", 0) or 0) + replica_rank)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=self.dtype, attn_implementation="sdpa")
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        pad = self.model.generation_config.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)

    async def _on_torch_thread(self, fn: Any, *args: Any) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(self.torch_thread, fn, *args)

    # verl's lifecycle calls: weights and KV cache stay in host memory here.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True,
                                 reject_request: bool = False) -> dict[str, Any]:
        return {}

    async def resume_generation(self) -> None:
        return None

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {}

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def adapter_report(self) -> dict[str, Any]:
        """Whether generation runs with the trained adapter, and the steps it arrived at."""
        from peft import PeftModel

        return {"adapter_loaded": isinstance(self.model, PeftModel),
                "adapter_steps": list(self.adapter_steps), "sync_adapter": self.sync_adapter}

    async def load_weights(self, tensors: list[tuple[str, torch.Tensor]],
                           peft_config: dict[str, Any] | None, base_sync_done: bool,
                           global_steps: int | None) -> int:
        """Load what verl's weight sync sent: base weights, or a LoRA adapter."""
        return await self._on_torch_thread(self._load_weights, tensors, peft_config,
                                           base_sync_done, global_steps)

    def _load_weights(self, tensors: list[tuple[str, torch.Tensor]],
                      peft_config: dict[str, Any] | None, base_sync_done: bool,
                      global_steps: int | None) -> int:
        if peft_config and base_sync_done:
            if self.sync_adapter:
                self._load_adapter(dict(tensors), peft_config)
                self.adapter_steps.append(global_steps)
                if folder := custom_settings(self.config).get("agreement_dir"):
                    save_agreement(folder, f"adapter_{global_steps}",
                                   {"tensors": dict(tensors), "peft_config": peft_config})
            return len(tensors)
        base = self._base_model()
        own = base.state_dict()
        # verl names LoRA-wrapped layers as vLLM's LoRA layers hold them (`.base_layer.`).
        state = {name.replace(".base_layer.", "."): tensor for name, tensor in tensors}
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"the actor sent weights the rollout model does not have: "
                           f"{unknown[:5]} ({len(unknown)} in all)")
        base.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)
        return len(tensors)

    def _base_model(self) -> torch.nn.Module:
        from peft import PeftModel

        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    def _load_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict[str, Any]) -> None:
        import dataclasses

        from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        known = {f.name for f in dataclasses.fields(LoraConfig)}
        config = LoraConfig(**{k: v for k, v in peft_config.items()
                               if k in known and k not in ("peft_type", "task_type")})
        if not isinstance(self.model, PeftModel):
            self.model = get_peft_model(self.model, config)
            self.model.train(self.sample_with_dropout)
        result = set_peft_model_state_dict(
            self.model, {k: v.to(self.dtype) for k, v in tensors.items()})
        if result.unexpected_keys:
            raise KeyError(f"adapter tensors the rollout model has no place for: "
                           f"{result.unexpected_keys[:5]}")

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None, video_data: Any = None,
                       **kwargs: Any) -> TokenOutput:
        """verl's token-in, token-out call: sample a response to ``prompt_ids``, batched
        with the requests that arrive with it."""
        import asyncio

        request = _Request(list(prompt_ids), dict(sampling_params),
                           asyncio.get_running_loop().create_future())
        self.pending.append(request)
        if self.server_task is None or self.server_task.done():
            self.server_task = asyncio.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        """Generate the pending requests, a batch at a time, until none is left."""
        import asyncio

        while self.pending:
            # verl sends a step's requests together: let the rest of them arrive.
            await asyncio.sleep(BATCH_WINDOW_S)
            batch = self._next_batch()
            try:
                outputs = await self._on_torch_thread(self._generate, batch)
            except BaseException as exc:  # each caller gets the error, and it ends here
                for request in batch:
                    request.future.set_exception(exc)
                continue
            for request, output in zip(batch, outputs, strict=True):
                request.future.set_result(output)

    def _next_batch(self) -> list[_Request]:
        """The oldest request and those waiting with the same sampling settings (train and
        validation requests differ), at most ``max_batch``."""
        key = _sampling_key(self.pending[0].params)
        batch = [r for r in self.pending if _sampling_key(r.params) == key][:self.max_batch]
        taken = {id(r) for r in batch}
        self.pending = [r for r in self.pending if id(r) not in taken]
        return batch

    @torch.no_grad()
    def _generate(self, batch: list[_Request]) -> list[TokenOutput]:
        params = batch[0].params
        caps = [self._max_tokens(r) for r in batch]
        temperature = float(params.get("temperature", 1.0))
        generation = sampling_config(params, max(caps), sorted(self.eos_ids), self.pad_id)
        # Left padding: every prompt ends where generation starts.
        width = max(len(r.prompt_ids) for r in batch)
        inputs = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(inputs)
        for row, request in enumerate(batch):
            inputs[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            mask[row, width - len(request.prompt_ids):] = 1
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
            out = self.model.generate(input_ids=inputs, attention_mask=mask,
                                      generation_config=generation)
        # The actor's log-probabilities are of logits / temperature (verl's loss), so the
        # rollout's are too; vLLM's processed log-probs are the same quantity.
        logits = torch.stack(out.logits, dim=1).float()
        if temperature > 0:
            logits = logits / temperature
        outputs = []
        for row, (request, cap) in enumerate(zip(batch, caps, strict=True)):
            tokens = out.sequences[row, width:].tolist()[:cap]
            end = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
            tokens = tokens if end is None else tokens[:end + 1]  # vLLM keeps the EOS token
            log_probs = None
            if request.params.get("logprobs"):
                log_probs = torch.log_softmax(logits[row, :len(tokens)], dim=-1)[
                    torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
            # vLLM's server reports both an end of sequence and the length cap as "completed".
            outputs.append(TokenOutput(token_ids=tokens, log_probs=log_probs,
                                       stop_reason="completed",
                                       extra_fields={"global_steps": self.global_steps}))
        return outputs

    def _max_tokens(self, request: _Request) -> int:
        """The request's response cap, as verl's vLLM server computes it."""
        params = request.params
        cap = params.get("max_tokens", params.get("max_new_tokens"))
        if cap is None:
            cap = min(self.config.response_length, self.config.prompt_length
                      + self.config.response_length - len(request.prompt_ids))
        return max(1, int(cap))


def sampling_config(params: dict[str, Any], max_new_tokens: int, eos_ids: list[int],
                    pad_id: int) -> Any:
    """transformers' ``GenerationConfig`` for verl's sampling parameters (vLLM's names and
    conventions: top_k -1 is off, temperature 0 is greedy), with the raw logits returned."""
    from transformers import GenerationConfig

    from rl_pipeline.evaluation.generate import transformers_top_k

    temperature = float(params.get("temperature", 1.0))
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=float(params.get("top_p", 1.0)),
        top_k=transformers_top_k(int(params.get("top_k", -1))),
        repetition_penalty=float(params.get("repetition_penalty", 1.0)),
        eos_token_id=eos_ids, pad_token_id=pad_id,
        output_logits=True, return_dict_in_generate=True)


def _sampling_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()
                        if k not in ("max_tokens", "max_new_tokens")))


def compute_dtype(name: str) -> torch.dtype:
    """verl's ``rollout.dtype`` as a torch dtype for this CPU (auto: float32)."""
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "auto": torch.float32,
              "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if str(name) not in dtypes:
        raise ValueError(f"the CPU rollout computes in float32 or bfloat16, not {name!r}")
    return dtypes[str(name)]


class HFReplica(RolloutReplica):
    """A rollout replica served by one :class:`HFServer` actor beside verl's workers."""

    async def launch_servers(self) -> None:
        name = f"{ROLLOUT}_server_{self.replica_rank}_0"
        node = await self.workers[0].__ray_call__.remote(
            lambda worker: ray.get_runtime_context().get_node_id())
        server = ray.remote(HFServer).options(
            name=name, max_concurrency=self.max_concurrency, num_cpus=0,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node, soft=False),
        ).remote(config=self.config, model_config=self.model_config,
                 replica_rank=self.replica_rank)
        await server.adapter_report.remote()  # constructed: the model is loaded
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


class HFServerAdapter(BaseRollout):
    """The worker side of the HF rollout: forwards verl's weight sync to the server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any,
                 replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.has_server = rank % world == 0
        self.server: Any = None

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, global_steps: int | None = None,
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the CPU rollout takes named tensors, not {wire_format!r}")
        # Every rank drains the generator: gathering a sharded tensor is a collective.
        tensors = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in weights]
        if not self.has_server:
            return
        if self.server is None:
            self.server = ray.get_actor(f"{ROLLOUT}_server_{self.replica_rank}_0")
        await self.server.load_weights.remote(tensors, kwargs.get("peft_config"),
                                              kwargs.get("base_sync_done", True), global_steps)
        if global_steps is not None:
            await self.server.set_global_steps.remote(global_steps)


RolloutReplicaRegistry.register(ROLLOUT, lambda: HFReplica)
rollout_base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = ADAPTER_PATH
