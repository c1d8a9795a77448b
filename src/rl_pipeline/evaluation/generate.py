"""Generation back ends for evaluation: Hugging Face ``generate`` (CPU or GPU) and vLLM (GPU).

Both take chat conversations and return one :class:`Generation` per (prompt, sample), with
the response text, its token count and whether it hit the token cap.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import resource
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from rl_pipeline.params import DataParams, EvalParams
from rl_pipeline.params.eval import samples_per_prompt
from rl_pipeline.plain_output import progress_bars_shown

logger = logging.getLogger(__name__)

Conversation = list[dict[str, Any]]


def transformers_top_k(top_k: int) -> int:
    """A top-k in vLLM's convention (-1: off) as transformers' ``generate`` takes it.

    0 turns top-k off there; None does not: ``generate`` fills an unset top_k with its
    global default, 50, so a sampler asked for the whole vocabulary would keep 50 tokens.
    """
    return max(top_k, 0)


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample; ``greedy`` overrides the others (one sample, argmax)."""

    max_new_tokens: int
    n_samples: int = 1
    greedy: bool = False
    temperature: float = 0.7
    top_p: float = 0.7
    top_k: int = -1  # -1: no top-k (the spec's vLLM convention)
    seed: int = 42
    min_new_tokens: int = 0  # > 0 suppresses end-of-sequence until then (throughput tests)
    # data.data_apply_chat_template_kwargs: the template's arguments, as in training
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return samples_per_prompt(self.n_samples, self.greedy)


@dataclass(frozen=True)
class Generation:
    """One sampled response."""

    prompt_index: int
    sample_index: int
    text: str
    tokens: int
    truncated: bool


def pick_backend(requested: str) -> str:
    """``auto`` means vLLM when it is installed and CUDA is available, else Hugging Face."""
    if requested != "auto":
        if requested == "vllm" and not _vllm_usable():
            raise RuntimeError("eval.backend=vllm needs vLLM and a CUDA GPU; neither is "
                               "available here. Use eval.backend=hf (or auto).")
        return requested
    return "vllm" if _vllm_usable() else "hf"


@dataclass(frozen=True)
class GenerationRun:
    """The responses, and the process that generated them with its peak memory."""

    generations: list[Generation]
    pid: int
    # On a GPU the device's peak used memory while generating, every process's (vLLM runs
    # the model in an engine process of its own, so this process's allocator sees almost
    # none of it); on a CPU the process's peak resident memory.
    peak_memory_mib: float
    device: str


def generate(model_path: str, conversations: Sequence[Conversation], settings: SamplingSettings,
             backend: str = "auto", batch_size: int = 32, dtype: str = "auto",
             vllm_gpu_memory_utilization: float = 0.6, label: str = "",
             own_process: bool | None = None) -> GenerationRun:
    """Generate ``settings.samples`` responses per conversation with the chosen back end.

    Args:
        own_process: Generate in a child process of its own, which returns all its memory
            when it exits. None: whenever a GPU is used. vLLM does not reliably free GPU memory
            when an engine is deleted, and eval runs the base and the trained model one after
            the other, after training, in one Kedro process.
    """
    backend = pick_backend(backend)
    logger.info("Generating %d x %d responses for %s with %s", len(conversations),
                settings.samples, label or model_path, backend)
    args = (model_path, [list(c) for c in conversations], settings, backend, batch_size, dtype,
            vllm_gpu_memory_utilization, label)
    if own_process is None:
        own_process = backend == "vllm" or torch.cuda.is_available()
    if not own_process:
        return _generate_here(*args)
    # spawn, not fork: a forked child would inherit CUDA and vLLM state from this process.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_generate_here, *args).result()


def _generate_here(model_path: str, conversations: list[Conversation],
                   settings: SamplingSettings, backend: str, batch_size: int, dtype: str,
                   vllm_gpu_memory_utilization: float, label: str) -> GenerationRun:
    gpu = torch.cuda.is_available()
    with PeakSampler(_device_used_mib if gpu else None) as device:
        if backend == "vllm":
            out = generate_vllm(model_path, conversations, settings, dtype,
                                vllm_gpu_memory_utilization)
        else:
            out = HFGenerator(model_path, dtype).generate(conversations, settings, batch_size,
                                                          label)
    if gpu:
        peak = device.peak
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return GenerationRun(out, os.getpid(), round(peak, 1), "cuda" if gpu else "cpu")


def _device_used_mib() -> float:
    """Memory in use on the current GPU by every process (cudaMemGetInfo), in MiB."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


class PeakSampler:
    """The largest value ``read()`` returns while the block runs, sampled on a thread every
    ``interval_s`` (and once at each end). ``read=None`` samples nothing (``peak`` 0).

    Written by hand: the allocator's own peak (``torch.cuda.max_memory_reserved``) counts
    this process only, and NVML's per-process figures need the engine's pid.
    """

    def __init__(self, read: Any, interval_s: float = 0.1) -> None:
        self.read, self.interval_s, self.peak = read, interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, float(self.read()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakSampler:
        if self.read is not None:
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.read is not None:
            self._stop.set()
            self._thread.join()
            self._sample()


class HFGenerator:
    """Batched ``generate`` with left padding.

    Prompts are batched after sorting by length, so that little of each batch is padding.
    On a CPU, two changes make batched decoding faster without changing a single output
    (docs/benchmarks.md): the KV cache of a batch is static (preallocated), because the
    default dynamic cache is re-copied at every step; and grouped-query attention is expanded
    to the equivalent multi-head attention (see :func:`expand_grouped_query_attention`). A
    single sequence keeps the dynamic cache, which is faster for it.
    """

    def __init__(self, model_path: str, dtype: str = "auto",
                 expand_gqa: bool | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=_torch_dtype(dtype, self.device)).to(self.device).eval()
        if self.device == "cpu" if expand_gqa is None else expand_gqa:
            expand_grouped_query_attention(self.model)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.eos_ids.add(self.tokenizer.eos_token_id)

    def generate(self, conversations: Sequence[Conversation], settings: SamplingSettings,
                 batch_size: int = 32, label: str = "") -> list[Generation]:
        from transformers import GenerationConfig

        texts = self.tokenizer.apply_chat_template(list(conversations), tokenize=False,
                                                   add_generation_prompt=True,
                                                   **settings.chat_template_kwargs)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        config = GenerationConfig(
            max_new_tokens=settings.max_new_tokens,
            min_new_tokens=settings.min_new_tokens or None,
            do_sample=not settings.greedy,
            temperature=None if settings.greedy else settings.temperature,
            top_p=None if settings.greedy else settings.top_p,
            top_k=None if settings.greedy else transformers_top_k(settings.top_k),
            num_return_sequences=settings.samples,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self.eos_ids),
        )
        torch.manual_seed(settings.seed)
        out: list[Generation] = []
        batches = range(0, len(order), batch_size)
        for start in tqdm(batches, desc=f"Generating {label}".strip(), unit="batch",
                          disable=len(batches) < 2 or None):
            idx = order[start:start + batch_size]
            encoded = self.tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True,
                                     add_special_tokens=False).to(self.device)
            rows = len(idx) * settings.samples
            config.cache_implementation = "static" if self.device == "cpu" and rows > 1 else None
            with torch.inference_mode():
                sequences = self.model.generate(**encoded, generation_config=config)
            new_tokens = sequences[:, encoded["input_ids"].shape[1]:].tolist()
            for row, tokens in enumerate(new_tokens):
                prompt, sample = idx[row // settings.samples], row % settings.samples
                out.append(self._generation(prompt, sample, tokens, settings.max_new_tokens))
        return sorted(out, key=lambda g: (g.prompt_index, g.sample_index))

    def _generation(self, prompt: int, sample: int, tokens: list[int], cap: int) -> Generation:
        end = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
        response = tokens if end is None else tokens[:end]
        return Generation(prompt, sample,
                          # BPE text needs no "clean-up"; it would delete spaces before dots.
                          self.tokenizer.decode(response, skip_special_tokens=True,
                                                clean_up_tokenization_spaces=False),
                          tokens=len(response), truncated=end is None and len(tokens) >= cap)


def expand_grouped_query_attention(model: torch.nn.Module) -> bool:
    """Turn grouped-query attention into the equivalent multi-head attention, in place.

    Each key/value head's projection rows are repeated for the query heads that share it, so
    every query head gets its own, identical, key and value: the outputs do not change. It
    pays off for batched decoding on a CPU: with a padding mask transformers cannot use the
    attention kernel's grouped-query support and copies the whole KV cache ``groups`` times
    at every step instead; expanded, the cache is written once per token. Applies to
    Llama-style attention (``k_proj``, ``v_proj``, ``num_key_value_groups``); other models are
    left as they are.

    Returns:
        Whether the model was changed.
    """
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None)
    layers = [m for m in model.modules() if getattr(m, "num_key_value_groups", 1) > 1
              and isinstance(getattr(m, "k_proj", None), torch.nn.Linear)
              and isinstance(getattr(m, "v_proj", None), torch.nn.Linear)]
    if not layers or not heads or not kv_heads or heads == kv_heads:
        return False
    groups = heads // kv_heads
    for attention in layers:
        for name in ("k_proj", "v_proj"):
            old: torch.nn.Linear = getattr(attention, name)
            head_dim = old.out_features // kv_heads
            new = torch.nn.Linear(old.in_features, old.out_features * groups,
                                  bias=old.bias is not None, device=old.weight.device,
                                  dtype=old.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(old.weight.view(kv_heads, head_dim, -1)
                                 .repeat_interleave(groups, dim=0).reshape(new.weight.shape))
                if old.bias is not None:
                    new.bias.copy_(old.bias.view(kv_heads, head_dim)
                                   .repeat_interleave(groups, dim=0).reshape(-1))
            setattr(attention, name, new)
        attention.num_key_value_groups = 1
    config.num_key_value_heads = heads  # the cache is sized from the config
    return True


def generate_vllm(model_path: str, conversations: Sequence[Conversation],
                  settings: SamplingSettings, dtype: str = "auto",
                  gpu_memory_utilization: float = 0.6) -> list[Generation]:
    """vLLM's offline engine (GPU). The chat template is applied by ``LLM.chat``."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_path, dtype=dtype, seed=settings.seed,
              gpu_memory_utilization=gpu_memory_utilization)
    params = SamplingParams(
        n=settings.samples, max_tokens=settings.max_new_tokens, seed=settings.seed,
        temperature=0.0 if settings.greedy else settings.temperature,
        top_p=1.0 if settings.greedy else settings.top_p,
        top_k=-1 if settings.greedy else settings.top_k,
    )
    # vLLM draws its bar whatever the output is: not into a log file.
    results = llm.chat(list(conversations), params, use_tqdm=progress_bars_shown(),
                       chat_template_kwargs=settings.chat_template_kwargs or None)
    return [Generation(p, s, c.text, len(c.token_ids), c.finish_reason == "length")
            for p, result in enumerate(results) for s, c in enumerate(result.outputs)]


def _vllm_usable() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def _torch_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        # bfloat16 on GPUs; float32 on CPUs, where bfloat16 matmuls are slow without AMX.
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, name)


def sampling_settings(params: EvalParams, shared: DataParams) -> SamplingSettings:
    """How eval decodes, from the ``eval`` group (its response cap, a follower of ``data``'s,
    resolved) and ``data``'s chat-template arguments."""
    return SamplingSettings(
        max_new_tokens=params.max_new_tokens,
        n_samples=params.n_samples, greedy=params.greedy,
        temperature=params.rollout_val_temperature, top_p=params.rollout_val_top_p,
        top_k=params.rollout_val_top_k, seed=params.seed,
        chat_template_kwargs=dict(shared.data_apply_chat_template_kwargs))
