"""Locating a model: where a model input's weights and tokenizer are, and which rule found them.

The specs' model inputs are "the output folder of a model import component". Four layouts
are seen in practice (a Hugging Face folder, a model selector's subfolder, an MLflow
transformers model, an import component's metadata pointing at a folder), besides GGUF files
and hub ids. :func:`locate_model` finds the weights and tokenizer in any of them (a hub id
is downloaded, or read from the local cache); it reads and writes nothing else.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_pipeline.errors import UserError

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SEARCH_DEPTH = 4


class ModelResolutionError(UserError, FileNotFoundError):
    """No model, or more than one, where one was expected; the message lists what was tried."""


@dataclass(frozen=True)
class ModelLocation:
    """Where a model's parts are, and which rule found them."""

    model_dir: Path
    tokenizer_dir: Path
    rule: str
    gguf: Path | None = None


def locate_model(source: str | Path) -> ModelLocation:
    """Find the model in a folder of any known layout, a GGUF file, or a hub id.

    Raises:
        ModelResolutionError: If nothing, or more than one candidate, is found; the message
            lists what was looked for.
    """
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix == ".gguf":
            return ModelLocation(path.parent, path.parent, "gguf_file", gguf=path)
        raise ModelResolutionError(f"base model {path} is a file but not a .gguf model")
    if path.is_dir():
        return _locate_in_folder(path)
    if _HUB_ID.match(str(source)) and not str(source).startswith((".", "/", "~")):
        folder = _download(str(source))
        return ModelLocation(folder, folder, "hub_id")
    raise ModelResolutionError(
        f"base model {str(source)!r} not found: it is not an existing file or folder, and not "
        "a hub id of the form org/name")


def _locate_in_folder(root: Path) -> ModelLocation:
    looked = [f"{root}/config.json with weights ({', '.join(WEIGHT_PATTERNS)})"]
    if _is_hf_folder(root):
        return ModelLocation(root, root, "hf_folder")

    selector = root / "model_selector_args.json"
    looked.append(f"{selector} naming a model_name subfolder")
    if selector.is_file():
        name = _read_json(selector).get("model_name")
        if name and _is_hf_folder(root / name):
            return ModelLocation(root / name, root / name, "model_selector_args")

    mlmodel = root / "MLmodel"
    looked.append(f"{mlmodel} with a transformers or hftransformers flavour")
    if mlmodel.is_file():
        found = _locate_mlflow(root, mlmodel)
        if found:
            return found

    imported = root / "model_import_metadata.json"
    looked.append(f"{imported} with a local_dir")
    if imported.is_file():
        local = _read_json(imported).get("local_dir")
        if local and _is_hf_folder(Path(local)):
            return ModelLocation(Path(local), Path(local), "model_import_metadata")

    ggufs = sorted(root.glob("*.gguf"))
    looked.append(f"one {root}/*.gguf file")
    if len(ggufs) == 1:
        return ModelLocation(root, root, "gguf_in_folder", gguf=ggufs[0])
    if len(ggufs) > 1:
        raise ModelResolutionError(f"{root} holds {len(ggufs)} GGUF files; name one: "
                                   + ", ".join(g.name for g in ggufs))

    looked.append(f"a folder with config.json and weights up to {_SEARCH_DEPTH} levels below")
    candidates = _search(root)
    if not candidates:
        raise ModelResolutionError(f"no model found in {root}. Looked for:\n"
                                   + "\n".join(f"  - {item}" for item in looked))
    shallowest = min(len(c.relative_to(root).parts) for c in candidates)
    top = [c for c in candidates if len(c.relative_to(root).parts) == shallowest]
    if len(top) > 1:
        raise ModelResolutionError(
            f"{root} holds {len(top)} model folders at the same depth; name one of:\n"
            + "\n".join(f"  - {c}" for c in top))
    tokenizer_dir = top[0] if _has_tokenizer(top[0]) else _nearest_tokenizer(root, top[0])
    return ModelLocation(top[0], tokenizer_dir, "search")


def _locate_mlflow(root: Path, mlmodel: Path) -> ModelLocation | None:
    import yaml

    flavors = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors", {})
    for name in ("hftransformersv2", "hftransformers"):
        if name in flavors:  # Azure ML's flavour: data/model, data/tokenizer
            data = root / flavors[name].get("model_data", "data")
            model, tokenizer = data / "model", data / "tokenizer"
            if _is_hf_folder(model):
                return ModelLocation(model, tokenizer if _has_tokenizer(tokenizer) else model,
                                     f"mlflow_{name}")
    if "transformers" in flavors:  # MLflow's own flavour: model/, components/tokenizer/
        model = root / flavors["transformers"].get("model_binary", "model")
        tokenizer = root / "components" / "tokenizer"
        if _is_hf_folder(model):
            return ModelLocation(model, tokenizer if _has_tokenizer(tokenizer) else model,
                                 "mlflow_transformers")
    return None


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(
        next(path.glob(p), None) for p in WEIGHT_PATTERNS)


def _has_tokenizer(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in ("tokenizer.json",
                                                                 "tokenizer_config.json"))


def _nearest_tokenizer(root: Path, model_dir: Path) -> Path:
    for folder in [model_dir, *model_dir.parents]:
        if _has_tokenizer(folder):
            return folder
        if folder == root:
            break
    return model_dir


def _search(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if depth >= _SEARCH_DEPTH:
            dirnames.clear()
        if depth and _is_hf_folder(Path(dirpath)):
            found.append(Path(dirpath))
            dirnames.clear()
    return sorted(found)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo_id))
    except Exception as exc:  # offline, unknown id, gated: the hub raises many types
        raise ModelResolutionError(
            f"base model {repo_id!r} looks like a hub id, but it could not be downloaded and "
            f"is not in the local cache ({type(exc).__name__}: {exc}). On a machine with "
            f"access run `hf download {repo_id} --local-dir DIR`, bring DIR here and set "
            "base_model to it; or set HF_HOME to a cache that holds it.") from exc


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelResolutionError(f"{path}: not readable JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}
