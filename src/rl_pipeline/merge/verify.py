"""Proof that a merged model equals its base plus adapter: logits on probe prompts.

(A fully fine-tuned model is copied instead of merged; :func:`verify_copy` checks the copy
against its source in the copy's dtype, within :data:`TOLERANCES`.)

The merged model runs the same probe prompts as peft's ``PeftModel`` (base + adapter,
unmerged), both in float32 whatever the merge's dtype (a bfloat16 or float16 merge's weights
upcast exactly; so do the base's), so that what differs is the merge, not the rounding of two
low-precision computations:

* float32: the largest absolute logit difference within ``1e-4 + 1e-5 * max|logit|``, only
  the order of float32 operations differing.
* bfloat16, float16: the reference is peft's own merge (``merge_and_unload``) rounded to that
  dtype, the rounding a correct merge cannot avoid (the merge computes ``W + scale * B @ A``
  in float32 as peft does, and both round it once: the weights come out equal, here to the
  bit); the merged model may differ from it by the float32 tolerance or a quarter of what
  that rounding changes (``0.25 * max|rounded - unrounded|``), whichever is larger. A wrong
  scale misses a share of the adapter's whole effect, which is larger (for an adapter that
  moves a logit by more than the float32 tolerance at all). Computed in bfloat16
  against the unrounded reference, the two computations' rounding alone (4% of the largest
  logit) exceeded a small adapter's whole effect: an unmerged model passed.

A merge whose dtype rounds most of the adapter's change away is the merge peft would make,
and passes; the result says how much of the effect the rounding took (``rounding_share``),
and the merge stage warns above half.

The models are loaded one after the other, in float32: verification needs the memory of one
model in float32.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch

from rl_pipeline.models.tokenizer import chat_prompt_ids

TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (0.0, 4e-2),
              torch.float16: (0.0, 1e-2)}  # (atol, rtol) of a copy, computed in its dtype
FLOAT32 = TOLERANCES[torch.float32]
# A low-precision merge may differ from peft's merge rounded to its dtype by this share of
# what the rounding changes.
ROUNDING_SHARE = 0.25
DEFAULT_PROBES = (
    "Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
    "Write a haiku about gradient descent.",
    "2 + 2 =",
)


def verify_merge(base_dir: str | Path, adapter_dir: str | Path, merged_dir: str | Path,
                 probes: tuple[str, ...] = DEFAULT_PROBES,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Compare the merged model's logits with base + adapter through peft.

    Args:
        dtype: The merged model's dtype (the comparison is in float32 whatever it is).

    Returns:
        ``max_abs_diff``, ``tolerance``, ``passed``, ``adapter_effect`` (the largest change
        the adapter makes to a logit), ``rounding_share`` (what the dtype's rounding changes,
        as a share of that), ``max_abs_logit``, ``dtype``, ``compared_in``, ``probes``.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    inputs = _inputs(AutoTokenizer.from_pretrained(str(merged_dir)), probes)
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32)
    merged_logits = _logits(merged.eval(), inputs)
    del merged
    gc.collect()
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    reference = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    reference_logits = _logits(reference, inputs)
    with reference.disable_adapter():
        base_logits = _logits(reference, inputs)
    rounded_logits = reference_logits
    if dtype != torch.float32:  # peft's merge, its weights rounded as the merged model's were
        rounded = reference.merge_and_unload()
        with torch.no_grad():
            for parameter in rounded.parameters():  # (not the buffers: rotary inv_freq is
                parameter.copy_(parameter.to(dtype))  # computed, the merged model's too)
        rounded_logits = _logits(rounded, inputs)
    del reference, base
    gc.collect()

    effect = _largest(reference_logits, base_logits)
    rounding = _largest(rounded_logits, reference_logits)
    diff = _largest(merged_logits, rounded_logits)
    scale = max(float(r.abs().max()) for r in reference_logits)
    tolerance = max(FLOAT32[0] + FLOAT32[1] * scale, ROUNDING_SHARE * rounding)
    return {"max_abs_diff": diff, "tolerance": tolerance, "passed": diff <= tolerance,
            "adapter_effect": effect, "rounding_share": rounding / effect if effect else 0.0,
            "max_abs_logit": scale, "dtype": str(dtype).removeprefix("torch."),
            "compared_in": "float32", "probes": len(probes)}


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

    inputs = _inputs(AutoTokenizer.from_pretrained(str(merged_dir)), probes)

    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=dtype).eval()
    merged_logits = _logits(merged, inputs)
    del merged
    gc.collect()

    reference = load_reference().eval()
    reference_logits = _logits(reference, inputs)
    del reference
    gc.collect()

    diff = _largest(merged_logits, reference_logits)
    scale = max(float(r.abs().max()) for r in reference_logits)
    atol, rtol = TOLERANCES[dtype]
    tolerance = atol + rtol * scale
    return {"max_abs_diff": diff, "tolerance": tolerance, "passed": diff <= tolerance,
            "max_abs_logit": scale, "dtype": str(dtype).removeprefix("torch."),
            "probes": len(probes)}


def _largest(these: list[torch.Tensor], those: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(these, those, strict=True))


def _inputs(tokenizer, probes: tuple[str, ...]) -> list[torch.Tensor]:
    return [_encode(tokenizer, text) for text in probes]


def _encode(tokenizer, text: str) -> torch.Tensor:
    if tokenizer.chat_template:
        return chat_prompt_ids(tokenizer, [{"role": "user", "content": text}],
                               return_tensors="pt")
    return tokenizer(text, return_tensors="pt")["input_ids"]


def _logits(model, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(input_ids=ids).logits.float() for ids in inputs]
