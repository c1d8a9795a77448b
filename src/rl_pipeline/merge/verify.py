"""Proof that a merged model equals its base plus adapter: logits on probe prompts.

(A fully fine-tuned model is copied instead of merged; :func:`verify_copy` checks the copy
against its source the same way.)

The merged model and peft's ``PeftModel`` (base + adapter, unmerged) run the same probe
prompts; the largest absolute logit difference must be within a tolerance that depends on
the dtype, ``atol + rtol * max|logit|``:

* float32: atol 1e-4, rtol 1e-5. Only the order of float32 operations differs.
* bfloat16: atol 0, rtol 4e-2. The merged weights are rounded once to 8 mantissa bits,
  while peft rounds the base and the LoRA branch separately.
* float16: atol 0, rtol 1e-2. As bfloat16, with 11 mantissa bits.

The models are loaded one after the other, so verification needs the memory of one model.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch

from rl_pipeline.models.tokenizer import chat_prompt_ids

TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (0.0, 4e-2),
              torch.float16: (0.0, 1e-2)}
DEFAULT_PROBES = (
    "Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
    "Write a haiku about gradient descent.",
    "2 + 2 =",
)


def verify_merge(base_dir: str | Path, adapter_dir: str | Path, merged_dir: str | Path,
                 probes: tuple[str, ...] = DEFAULT_PROBES,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Compare the merged model's logits with base + adapter through peft.

    Returns:
        ``max_abs_diff``, ``tolerance``, ``passed``, ``max_abs_logit``, ``dtype``, ``probes``.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def reference():
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype)
        return PeftModel.from_pretrained(base, str(adapter_dir))

    return _compare(merged_dir, reference, probes, dtype)


def verify_copy(source_dir: str | Path, copied_dir: str | Path,
                probes: tuple[str, ...] = DEFAULT_PROBES,
                dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Compare a copied (and possibly re-typed) model's logits with its source's.

    Returns:
        As :func:`verify_merge`.
    """
    from transformers import AutoModelForCausalLM

    return _compare(copied_dir, lambda: AutoModelForCausalLM.from_pretrained(
        str(source_dir), dtype=dtype), probes, dtype)


def _compare(merged_dir: str | Path, load_reference, probes: tuple[str, ...],
             dtype: torch.dtype) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    inputs = [_encode(tokenizer, text) for text in probes]

    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=dtype).eval()
    merged_logits = _logits(merged, inputs)
    del merged
    gc.collect()

    reference = load_reference().eval()
    reference_logits = _logits(reference, inputs)
    del reference
    gc.collect()

    diff = max(float((m - r).abs().max()) for m, r in zip(merged_logits, reference_logits,
                                                        strict=True))
    scale = max(float(r.abs().max()) for r in reference_logits)
    atol, rtol = TOLERANCES[dtype]
    tolerance = atol + rtol * scale
    return {"max_abs_diff": diff, "tolerance": tolerance, "passed": diff <= tolerance,
            "max_abs_logit": scale, "dtype": str(dtype).removeprefix("torch."),
            "probes": len(probes)}


def _encode(tokenizer, text: str) -> torch.Tensor:
    if tokenizer.chat_template:
        return chat_prompt_ids(tokenizer, [{"role": "user", "content": text}],
                               return_tensors="pt")
    return tokenizer(text, return_tensors="pt")["input_ids"]


def _logits(model, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(input_ids=ids).logits.float() for ids in inputs]
