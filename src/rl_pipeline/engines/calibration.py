"""A short measurement of this machine on the configured run: the forecast's basis on a CPU.

It does, once, the work a training step and an eval batch repeat, with the configured model,
LoRA, precision and sampling: it generates the first step's prompts x completions (which also
measures the responses' real length: the response cap overstates it several times on short
answers), runs one forward pass over those sequences (a log-probability pass) and one
forward and backward pass with the adapter (an update), then generates one eval batch as eval
does. A few seconds to half a minute with SmolLM2-135M on 2 cores; the forecast scales it
(:mod:`rl_pipeline.engines.forecast`).
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.parquet as pq
import torch

from rl_pipeline.engines.work import EvalWork, StepWork
from rl_pipeline.models.facts import GiB

logger = logging.getLogger(__name__)
# The calibration's batch at most: enough sequences that batched kernels behave as in a
# step, few enough that the calibration stays seconds (a bigger step scales linearly).
MAX_CALIBRATION_SEQUENCES = 16


@dataclass(frozen=True)
class Calibration:
    """What one step's work and one eval batch took here, for ``sequences`` sequences."""

    sequences: int            # prompts x completions generated and passed through the model
    rollout_s: float          # generating them (sampling, the response cap)
    response_tokens: float    # their mean length, end-of-sequence excluded
    forward_s: float          # one forward pass over prompt + response (no gradient)
    update_s: float           # one forward and backward pass with the adapter
    load_s: float             # loading the model (and the adapter)
    eval_batch_s: float       # one eval batch, as eval generates it
    eval_batch_sequences: int
    peak_rss_gib: float       # this process's peak resident memory, calibration included
    seconds: float            # the whole calibration

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def calibrate(model_path: str, train_file: str, val_file: str, work: StepWork,
              eval_work: EvalWork, chat_template_kwargs: dict[str, Any]) -> Calibration:
    """Measure the configured step's parts and one eval batch on this machine (module
    docstring). The model loads as the engines train it on a CPU: float32 unless the
    engine's precision says otherwise."""
    from transformers import AutoModelForCausalLM

    from rl_pipeline.models.tokenizer import load_tokenizer

    started = time.perf_counter()
    torch.manual_seed(work.seed)
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = max(1, min(work.prompts, MAX_CALIBRATION_SEQUENCES // work.completions))
    texts = tokenizer.apply_chat_template(conversations(train_file, prompts), tokenize=False,
                                          add_generation_prompt=True, **chat_template_kwargs)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, work.dtype))
    if work.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **work.lora))
    load_s = time.perf_counter() - started

    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    top_k = work.top_k if work.top_k > 0 else None
    began = time.perf_counter()
    with torch.inference_mode():
        sequences = model.generate(
            **encoded, do_sample=work.temperature > 0, temperature=work.temperature or None,
            top_p=work.top_p, top_k=top_k, max_new_tokens=work.response_cap,
            num_return_sequences=work.completions, pad_token_id=tokenizer.pad_token_id)
    rollout_s = time.perf_counter() - began
    sequences = sequences.clone()  # an inference tensor cannot enter the backward pass
    prompt_width = encoded["input_ids"].shape[1]
    stops = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    lengths = [next((i for i, t in enumerate(row) if t in stops), len(row))
               for row in sequences[:, prompt_width:].tolist()]
    mask = torch.ones_like(sequences)  # the padding after an end is attended, as in a batch
    mask[:, :prompt_width] = encoded["attention_mask"].repeat_interleave(work.completions, 0)

    began = time.perf_counter()
    with torch.inference_mode():
        _token_log_probs(model, sequences, mask)
    forward_s = time.perf_counter() - began

    model.train()
    began = time.perf_counter()
    _token_log_probs(model, sequences, mask).mean().backward()
    update_s = time.perf_counter() - began
    del model, sequences

    eval_batch_s, eval_sequences = _eval_batch(model_path, val_file, eval_work,
                                               chat_template_kwargs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB
    calibration = Calibration(
        sequences=len(lengths), rollout_s=rollout_s, response_tokens=sum(lengths) / len(lengths),
        forward_s=forward_s, update_s=update_s, load_s=load_s, eval_batch_s=eval_batch_s,
        eval_batch_sequences=eval_sequences, peak_rss_gib=peak,
        seconds=time.perf_counter() - started)
    logger.info("Calibrated on this machine in %.1f s: %d sequences generated in %.2f s (mean "
                "response %.1f tokens), a forward pass %.2f s, forward and backward %.2f s, "
                "an eval batch of %d in %.2f s", calibration.seconds, calibration.sequences,
                rollout_s, calibration.response_tokens, forward_s, update_s, eval_sequences,
                eval_batch_s)
    return calibration


def _token_log_probs(model: torch.nn.Module, sequences: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """The sequences' token log-probabilities, as both engines' losses compute them."""
    logits = model(input_ids=sequences, attention_mask=mask).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)


def _eval_batch(model_path: str, prompts_file: str, work: EvalWork,
                chat_template_kwargs: dict[str, Any]) -> tuple[float, int]:
    """One eval batch generated as eval generates it (its generator, its settings)."""
    from dataclasses import replace

    from rl_pipeline.evaluation.generate import HFGenerator

    generator = HFGenerator(model_path, work.dtype)
    prompts = min(work.batch_size, work.prompts)
    settings = replace(work.sampling, chat_template_kwargs=chat_template_kwargs)
    began = time.perf_counter()
    generator.generate(conversations(prompts_file, prompts), settings, work.batch_size)
    return time.perf_counter() - began, prompts * settings.samples


def conversations(prompts_file: str, n: int) -> list[list[dict[str, str]]]:
    """The first ``n`` prompts of a prompts file (verl's schema: chat messages)."""
    # Only the first batch of the prompt column: a training set can be large.
    batch = next(pq.ParquetFile(prompts_file).iter_batches(batch_size=n, columns=["prompt"]),
                 None)
    prompts = batch.column("prompt").to_pylist() if batch is not None else []
    return [[{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
            for prompt in prompts]
