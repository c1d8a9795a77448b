"""verl's rollout served by transformers (``actor_rollout_ref.rollout.name: hf``), through
verl's extension points: no vLLM, SGLang or TensorRT-LLM needed.

verl 0.9.1 registers only server rollouts (vllm, sglang, trtllm). This module registers a
fourth, ``hf``: :class:`HFReplica` (verl's public ``RolloutReplicaRegistry``) with one
:class:`HFServer` actor per replica, and :class:`HFServerAdapter`, the worker side that
verl's naive weight sync calls. LoRA travels as on the vLLM path: the base weights once,
then the adapter every step, loaded into a PEFT model, never merged.

It serves two modes (docs/gpu.md):

- ``train.verl.device: cpu``: verl on this machine's CPU (:mod:`rl_pipeline.engines.verl.cpu`
  imports this module once its platform is registered);
- ``device: cuda`` with ``ENGINE: hf``: verl's own CUDA workers and NCCL, the rollout on the
  GPU in transformers. A first-light and fallback mode, slower than vLLM, for a machine
  where vLLM is not installed (yet); verl's plugin hook imports this module in every Ray
  process (``VERL_USE_EXTERNAL_MODULES``, ``config.external_modules_override``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

ROLLOUT = "hf"
# The rollout server's batches: requests that arrive within the window join one batch.
BATCH_WINDOW_S = 0.02
MAX_BATCH = 32
# The worker-side rollout adapter, by the dotted path verl's private registry stores.
ADAPTER_PATH = f"{__name__}.HFServerAdapter"


def use_every_core() -> None:
    """Compute with every core of this machine's share, not Ray's one thread.

    Ray sets an actor's OMP_NUM_THREADS to its CPU count (a fraction here, so 1); the
    sync trainer runs the actor and the rollout server in turn, never together, so each
    may have the whole machine while it works.
    """
    torch.set_num_threads(len(os.sched_getaffinity(0)))


def rollout_device() -> str:
    """Where the rollout model computes: the GPU when this process sees one and verl's
    platform is not the CPU's (Ray leaves CUDA_VISIBLE_DEVICES set for an actor that asks
    for no GPU), else the CPU."""
    if os.environ.get("VERL_PLATFORM") == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return "cuda"


# What hf_rollout.agreement_dir records of each step (rl_pipeline.engines.verl.agreement).
AGREEMENT_FIELDS = ["prompts", "responses", "response_mask", "rollout_log_probs",
                    "old_log_probs"]


def save_agreement(folder: str, name: str, record: dict[str, Any]) -> None:
    """One record of ``hf_rollout.agreement_dir``: ``step_N`` (a step's batch) or
    ``adapter_N`` (the adapter the rollout loaded after step N; 0: before training)."""
    from rl_pipeline.runs.staging import staged

    with staged(os.path.join(folder, f"{name}.pt")) as path:
        torch.save(record, path)


def custom_settings(config: Any) -> dict[str, Any]:
    """``rollout.custom.hf_rollout``: the transformers rollout's own settings."""
    custom = getattr(config, "custom", None) or {}
    return dict(custom.get("hf_rollout", {}) or {})


@dataclass
class _Request:
    """One ``generate`` call waiting for its batch."""

    prompt_ids: list[int]
    params: dict[str, Any]
    future: Any  # asyncio.Future[TokenOutput]


class HFServer:
    """One rollout server: a transformers model (on the GPU where this process sees one,
    else on the CPU: :func:`rollout_device`), answering verl's token-in, token-out
    ``generate`` with the log-probabilities verl compares with the actor's.

    verl's agent loop sends every sample of a step as its own request, all at once; the
    server gathers the requests that arrive together and generates them as one batch, then
    answers each (SmolLM2's 8 samples of a step: 3-4 s as one batch, 12 s one by one).
    A prompt that several requests repeat (verl's ``rollout.n`` samples) goes through the
    model once (:func:`shared_prompt_cache`).

    The model computes in the rollout's dtype (``rollout.dtype``; auto: float32 on a CPU,
    bfloat16 on a GPU), which the CPU mode also gives the actor (``config.cpu_overrides``):
    the rollout samples the very policy the actor trains, token probabilities equal up to
    summation order (docs/gpu.md). Sampling
    draws from ``rollout.seed`` (plus the replica's rank), as vLLM's does.

    The base weights come from the model folder, then from the actor (verl's first weight
    sync); with LoRA the adapter arrives every step and is loaded into a PEFT model, as
    vLLM's ``add_lora`` does on the GPU path. ``hf_rollout.sync_adapter: false`` (in
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
        # How long the first request of a batch waits for the rest. On a busy machine a
        # step's requests can arrive further apart, and a batch split differently draws
        # other random numbers: a test that compares two runs' samples waits longer.
        self.batch_window_s = float(custom_settings(config).get("batch_window_s",
                                                                BATCH_WINDOW_S))
        # A diagnostic: sample with the adapter's dropout on, as TRL's GRPOTrainer does (its
        # model stays in training mode while it generates). The rollout then samples another
        # policy than the actor's, which the rollout-policy check reports.
        self.sample_with_dropout = bool(custom_settings(config).get("sample_with_dropout",
                                                                    False))
        self.device = rollout_device()
        self.dtype = compute_dtype(config.dtype, self.device)
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
            path, dtype=self.dtype, attn_implementation="sdpa").to(self.device)
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        pad = self.model.generation_config.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)

    async def _on_torch_thread(self, fn: Any, *args: Any) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(self.torch_thread, fn, *args)

    # verl's lifecycle calls: weights stay loaded, and transformers' KV cache lives only
    # while a batch generates.
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

        return {"adapter_loaded": isinstance(self.model, PeftModel), "device": self.device,
                "dtype": str(self.dtype).removeprefix("torch."),
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
            await asyncio.sleep(self.batch_window_s)
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
        # verl's agent-loop workers send their requests concurrently, in no fixed order: in
        # prompt order, each row of the batch draws the same random numbers run after run,
        # whatever the arrival order or the number of ranks (docs/benchmarks.md, "Two ranks").
        return sorted(batch, key=lambda r: r.prompt_ids)

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
        inputs, mask = inputs.to(self.device), mask.to(self.device)
        with torch.autocast(self.device, dtype=self.dtype, enabled=self.dtype != torch.float32):
            # Dropout draws a mask per row: a shared prefill would share it.
            cache = None if self.model.training else shared_prompt_cache(self.model, inputs,
                                                                         mask)
            out = self.model.generate(input_ids=inputs, attention_mask=mask,
                                      past_key_values=cache, generation_config=generation)
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


def shared_prompt_cache(model: torch.nn.Module, inputs: torch.Tensor,
                        mask: torch.Tensor) -> Any:
    """The KV cache of a left-padded batch's prompts, each distinct prompt computed once.

    verl sends each of a prompt's ``rollout.n`` samples as a request of its own, and
    transformers' ``generate`` would compute the prompt's keys and values once per row
    (vLLM's prefix cache shares them; transformers has no equivalent for a batch). Every
    prompt token but the last goes through the model once per distinct prompt; the cache is
    then copied to the rows that repeat it, and ``generate`` goes on from the last prompt
    token, with the positions it computes itself (from the attention mask). None where no
    prompt repeats: nothing to share.
    """
    from transformers import DynamicCache

    if inputs.shape[1] < 2:
        return None
    # Tokens and mask together: a prompt that starts with the pad token pads like a shorter one.
    distinct, rows = torch.unique(torch.cat([inputs, mask], dim=1), dim=0, return_inverse=True)
    if len(distinct) == len(inputs):
        return None
    first = torch.stack([(rows == d).nonzero()[0, 0] for d in range(len(distinct))])
    prefix, prefix_mask = inputs[first, :-1], mask[first, :-1]
    positions = (prefix_mask.long().cumsum(-1) - 1).masked_fill(prefix_mask == 0, 0)
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, attention_mask=prefix_mask, position_ids=positions,
          past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache.batch_select_indices(rows)
    return cache


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


def compute_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """verl's ``rollout.dtype`` as a torch dtype (auto: float32 on a CPU, bfloat16 on a GPU,
    what vLLM would pick for a bfloat16 checkpoint)."""
    auto = torch.float32 if device == "cpu" else torch.bfloat16
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "auto": auto,
              "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if str(name) not in dtypes:
        raise ValueError(f"the hf rollout computes in float32 or bfloat16, not {name!r}")
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
            raise ValueError(f"the hf rollout takes named tensors, not {wire_format!r}")
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
