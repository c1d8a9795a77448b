"""What the estimates of a run need to know of its base model, read from the model folder's
own files (config.json and the safetensors headers, no weights loaded): its size, its shapes,
and the size of a LoRA adapter on it, and whether its target modules are there. The verl
preflight's host checks, both preflights and the forecast of any engine use them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 2**30
# A CUDA context and the allocator's slack, per process on a GPU (the actor's and vLLM's).
CUDA_CONTEXT_GIB = 1.0
# The merged model and the adapter export sit beside the checkpoints: twice the model in
# its own dtype, plus eval's generations (small).
MERGE_COPIES = 2


@dataclass(frozen=True)
class ModelFacts:
    """What the estimates need from the base model's folder (config.json, safetensors
    headers): parameter count, bytes on disk, and the shapes that size the activations."""

    parameters: int
    bytes_on_disk: int
    vocab_size: int
    hidden_size: int
    layers: int
    lora_parameters: int  # at the configured rank and target modules

    @classmethod
    def read(cls, model_path: str, lora_rank: int, target_modules: Any) -> ModelFacts | None:
        """The facts of the model folder at ``model_path``, or None when it holds no
        config.json and safetensors (a hub id not yet fetched)."""
        folder = Path(model_path)
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if not files or not (folder / "config.json").is_file():
            return None
        from safetensors import safe_open

        config = _config(folder)
        config = config.get("text_config", config)
        targets = lora_target_names(target_modules)
        parameters = lora = 0
        for file in files:
            with safe_open(str(file), "pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                    shape = f.get_slice(name).get_shape()
                    numel = 1
                    for dim in shape:
                        numel *= dim
                    parameters += numel
                    if lora_rank and len(shape) == 2 and _is_lora_target(name, targets):
                        lora += lora_rank * (shape[0] + shape[1])
        return cls(parameters=parameters, bytes_on_disk=sum(f.stat().st_size for f in files),
                   vocab_size=int(config["vocab_size"]),
                   hidden_size=int(config["hidden_size"]),
                   layers=int(config["num_hidden_layers"]), lora_parameters=lora)


def _config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def max_positions(model_path: str) -> int | None:
    """The positions the model at ``model_path`` takes (config.json's
    max_position_embeddings, a multimodal model's text_config's), as verl reads them; None
    without a config.json (a hub id not yet fetched) or the field."""
    config = _config(Path(model_path))
    value = config.get("max_position_embeddings") or (
        config.get("text_config") or {}).get("max_position_embeddings")
    return int(value) if value else None


def lora_target_names(target_modules: Any) -> list[str] | None:
    """LoRA's target modules as names, or None for all linear layers (all-linear, a regex)."""
    if isinstance(target_modules, str):
        inner = target_modules.strip()
        if inner.startswith("[") and inner.endswith("]"):
            return [t.strip().strip("'\"") for t in inner[1:-1].split(",") if t.strip()]
        return None
    if target_modules is None:
        return None
    return [str(t) for t in target_modules]


def _is_lora_target(name: str, targets: list[str] | None) -> bool:
    """Whether the weight ``name`` is a linear layer LoRA wraps (all-linear leaves out the
    embeddings and the output head, as peft does)."""
    if not name.endswith(".weight") or "layers." not in name or "norm" in name:
        return False
    module = name.rsplit(".", 2)[-2]
    return targets is None or module in targets


def lora_target_problem(model_path: str, target_modules: Any) -> str | None:
    """What is allowed, when ``target_modules`` matches no module of the model at
    ``model_path``: a name that no weight belongs to (peft matches a name to the module's
    path, or its end after a dot), or a regex that matches no module's path; None when each
    name matches one, for all-linear, and for a folder without safetensors (a hub id not yet
    fetched).

    peft raises for a target that matches nothing only when it wraps the model, after the
    forecast has loaded it or at the first training step, with its traceback; and a misspelt
    name beside one that matches it skips without a word (an adapter on fewer layers than
    asked for). Both are caught here instead."""
    targets = lora_target_names(target_modules)
    regex = (target_modules.strip() if targets is None and isinstance(target_modules, str)
             and target_modules.strip() != "all-linear" else None)
    folder = Path(model_path)
    files = (sorted(folder.glob("*.safetensors")) if (targets or regex) and folder.is_dir()
             else [])
    if not files:
        return None
    from safetensors import safe_open

    modules: set[str] = set()
    for file in files:
        with safe_open(str(file), "pt") as f:
            modules.update(name.rsplit(".", 1)[0] for name in f.keys()  # noqa: SIM118
                           if name.endswith(".weight"))
    if _config(folder).get("tie_word_embeddings"):
        modules.add("lm_head")  # a module of the model, its weight the embeddings' (unsaved)
    embeddings, linear = _module_kinds(folder)
    linear = sorted(linear or {m.rsplit(".", 1)[-1] for m in modules
                               if _is_lora_target(f"{m}.weight", None)})
    layers = f"its linear layers: {', '.join(linear)} (or all-linear)"
    if regex is not None:
        if problem := _regex_problem(regex, modules, model_path, layers):
            return problem
        matched = {m for m in modules if re.fullmatch(regex, m)}
    else:
        by_target = {t: {m for m in modules if m == t or m.endswith(f".{t}")} for t in targets}
        if unknown := [t for t, found in by_target.items() if not found]:
            return (f"names of the model's modules: no module of {model_path} is named "
                    f"{', '.join(map(repr, unknown))}; {layers}")
        matched = set().union(*by_target.values())
    outside = sorted({m.rsplit(".", 1)[-1] for m in matched
                      if m in embeddings or m.rsplit(".", 1)[-1] in _NOT_MERGED})
    if outside:
        return (f"linear layers of the model's blocks: LoRA on {', '.join(outside)} cannot be "
                f"merged (peft saves those adapters with a copy of the base weights, or as "
                f"embedding factors, which the merge stage refuses after training); {layers}")
    return None


# The output head and the input embeddings: peft saves a LoRA on them with a copy of the base
# layer (lm_head.base_layer.weight) or as lora_embedding_A/B, which merge/lora.py refuses.
# By name where the model cannot be built (_module_kinds finds the others by kind: GPT-2's
# wte and wpe, GPT-NeoX's embed_in, ...).
_NOT_MERGED = {"lm_head", "embed_tokens"}


def _module_kinds(folder: Path) -> tuple[set[str], set[str]]:
    """The paths of the model's embedding layers and output head, and the names of its other
    linear layers (nn.Linear, GPT-2's Conv1D), from its config alone (the model built on the
    meta device: no weights read); empty where transformers cannot build it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)))
    except Exception:  # noqa: BLE001 (an architecture this transformers lacks: names only)
        return set(), set()
    head = model.get_output_embeddings()
    embeddings = {name for name, module in model.named_modules()
                  if isinstance(module, torch.nn.Embedding) or module is head}
    linear = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
              if isinstance(module, torch.nn.Linear | Conv1D) and name not in embeddings}
    return embeddings, linear


def _regex_problem(regex: str, modules: set[str], model_path: str, layers: str) -> str | None:
    # peft full-matches a string target against each module's whole path (a plain name
    # matches only a top-level module: a list of names is matched by their ends instead).
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        return f"a list '[q_proj,v_proj]' or a regex: {regex!r} is not one ({exc}); {layers}"
    if any(pattern.fullmatch(m) for m in modules):
        return None
    names = [n.strip() for n in regex.split(",")]
    listed = (f" (a list of names is written in brackets: '[{','.join(names)}]')"
              if all(re.fullmatch(r"\w+", n) for n in names) else "")
    return (f"a list '[q_proj,v_proj]' or a regex that matches the whole path of a module "
            f"(peft's test, e.g. '.*\\.(q_proj|v_proj)'): {regex!r} matches no module of "
            f"{model_path}{listed}; {layers}")
