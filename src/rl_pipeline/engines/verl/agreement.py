"""Why a rollout's token probabilities leave the actor's: the same tokens, recomputed.

verl's agreement metrics (:mod:`.rollout_check`) say *that* the rollout and the actor
disagree, not why. With ``+actor_rollout_ref.rollout.custom.hf_rollout.agreement_dir=DIR``
in ``train.verl.overrides`` a CPU run records, per step, the batch (prompt and response
tokens, the rollout's and the actor's log-probabilities) and every adapter the rollout
loaded (:func:`rl_pipeline.engines.verl.hf_rollout.save_agreement`). :func:`agreement_report`
then scores the same tokens again with a plain transformers + peft model in float32 and in
bfloat16, with the adapter the rollout held and with the one before it, and says which of
them each side matches:

- the rollout matches float32 with its adapter, and the actor does not: the actor computes
  something else (its precision, packing or position ids);
- the actor matches the previous adapter: the weight sync lags a step;
- neither matches: the LoRA scale, the temperature or the prompt tokens differ.

Measured this way (docs/gpu.md): verl's default bfloat16 actor beside a float32 rollout.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

# The comparisons of a step, in the report's order: (name, which adapter, dtype).
RECOMPUTED = (("float32, the rollout's adapter", 1, torch.float32),
              ("bfloat16, the rollout's adapter", 1, torch.bfloat16),
              ("float32, the adapter before it", 2, torch.float32))


@dataclasses.dataclass(frozen=True)
class Agreement:
    """verl's two views of how far two sets of token probabilities lie apart."""

    pearson: float  # of the probabilities (training/rollout_actor_probs_pearson_corr)
    mean_diff: float  # mean |p1 - p2| (training/rollout_probs_diff_mean)
    max_diff: float

    @classmethod
    def of(cls, log_probs_1: torch.Tensor, log_probs_2: torch.Tensor) -> Agreement:
        p1, p2 = log_probs_1.double().exp(), log_probs_2.double().exp()
        pearson = torch.corrcoef(torch.stack([p1, p2]))[0, 1].item()
        diff = (p1 - p2).abs()
        return cls(pearson if math.isfinite(pearson) else 1.0, diff.mean().item(),
                   diff.max().item())


def recompute_log_probs(model: torch.nn.Module, prompts: list[torch.Tensor],
                        responses: list[torch.Tensor], temperature: float,
                        dtype: torch.dtype) -> torch.Tensor:
    """The log-probability of each response token under ``model``, one unpadded sequence
    at a time (positions from 0, no packing), of logits / temperature as verl's loss."""
    out = []
    for prompt, response in zip(prompts, responses, strict=True):
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype,
                                             enabled=dtype != torch.float32):
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        if temperature > 0:
            logits = logits / temperature
        out.append(torch.log_softmax(logits, -1)[torch.arange(len(response)), response])
    return torch.cat(out)


def agreement_report(folder: str | Path, model_path: str | Path,
                     temperature: float) -> list[dict[str, Any]]:
    """Each recorded step: verl's own measure (rollout against actor) and each side
    against the recomputations of :data:`RECOMPUTED`.

    Args:
        folder: The run's ``hf_rollout.agreement_dir``.
        model_path: The base model the run trained (a transformers folder).
        temperature: The rollout temperature (``train.verl.rollout_temperature``).
    """
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    adapters = {int(p.stem.split("_")[1]): torch.load(p, weights_only=False)
                for p in folder.glob("adapter_*.pt")}
    if not adapters:
        raise FileNotFoundError(f"{folder}: no adapter_N.pt records (was the run started "
                                "with hf_rollout.agreement_dir, and LoRA?)")
    config = _lora_config(adapters[min(adapters)]["peft_config"], LoraConfig)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                attn_implementation="sdpa")
    model = get_peft_model(base, config).eval()
    rows = []
    for path in sorted(folder.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1])):
        step = int(path.stem.split("_")[1])
        record = torch.load(path, weights_only=False)
        tokens = [r[m.bool()] for r, m in zip(record["responses"], record["response_mask"],
                                              strict=True)]
        rollout = torch.cat([lp[:len(t)] for lp, t in zip(record["rollout_log_probs"],
                                                          tokens, strict=True)])
        actor = torch.cat([lp[:len(t)] for lp, t in zip(record["old_log_probs"], tokens,
                                                        strict=True)])
        row: dict[str, Any] = {"step": step, "tokens": len(rollout),
                               "rollout vs actor": Agreement.of(rollout, actor)}
        for name, back, dtype in RECOMPUTED:
            # The rollout of step N ran with the adapter synced after step N - 1.
            if step - back not in adapters:
                continue
            result = set_peft_model_state_dict(model, {
                k: v.float() for k, v in adapters[step - back]["tensors"].items()})
            if result.unexpected_keys:
                raise KeyError(f"adapter_{step - back}: tensors the model has no place for: "
                               f"{result.unexpected_keys[:3]}")
            again = recompute_log_probs(model, record["prompts"], tokens, temperature, dtype)
            row[name] = {"rollout": Agreement.of(rollout, again),
                         "actor": Agreement.of(actor, again)}
        rows.append(row)
    return rows


def _lora_config(peft_config: Any, lora_config_class: type) -> Any:
    """The adapter's configuration as the actor's engine built it (no dropout: eval)."""
    values = peft_config if isinstance(peft_config, dict) else dataclasses.asdict(peft_config)
    known = {f.name for f in dataclasses.fields(lora_config_class)}
    return lora_config_class(**{k: v for k, v in values.items()
                                if k in known and k not in ("peft_type", "task_type",
                                                            "lora_dropout")})
