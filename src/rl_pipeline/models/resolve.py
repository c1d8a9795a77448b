"""Turn any model input into a normal Hugging Face model folder, with a metadata file.

The specs' model inputs are "the output folder of a model import component". Four layouts
are seen in practice (notes/peers.md §6.4), besides plain Hugging Face folders, GGUF files
and hub ids. :func:`locate_model` finds the weights and tokenizer in any of them;
:func:`resolve_model` then materializes one folder that ``from_pretrained`` loads:

* an existing folder is mirrored with symbolic links (no copy of the weights);
* a GGUF file is dequantized by transformers and saved as safetensors (once; cached);
* a separate tokenizer folder (MLflow layouts) is linked in beside the weights;
* a configured chat template is written into the tokenizer config.

Each resolved folder carries ``model_metadata.json``: the source, the rule that found the
model, the parameter count, the dtype, whether there is a chat template, and a hash of the
weights. Folders are built under a temporary name and renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_pipeline.errors import UserError
from rl_pipeline.runs.staging import staged

# Where resolved folders live unless the catalog says otherwise (its base_model entry).
RESOLVED_DIR = "data/06_models/resolved"

logger = logging.getLogger(__name__)

METADATA_FILE = "model_metadata.json"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "merges.txt", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
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


@dataclass(frozen=True)
class ResolvedModel:
    """A normal Hugging Face model folder made from a model input."""

    path: Path
    metadata: dict[str, Any]


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


def resolve_model(source: str | Path, out_root: str | Path,
                  chat_template: str | None = None, link_files: bool = True) -> ResolvedModel:
    """Materialize ``source`` as a Hugging Face folder under ``out_root`` (cached).

    Args:
        source: A model folder (any known layout), a ``.gguf`` file, or a hub id.
        out_root: Where resolved folders live (one subfolder per source).
        chat_template: A Jinja chat template, or a path to a ``.jinja`` file, for models
            without one (or to replace theirs).
        link_files: Link the files of a model folder (a hub download: into the Hugging Face
            cache) rather than copy them. Copies are for an ``out_root`` on shared storage,
            read by other machines that do not have the links' targets.

    Returns:
        The resolved folder and its metadata.

    Raises:
        ModelResolutionError: If the model cannot be found.
        ValueError: If the model has no chat template and none is configured.
    """
    location = locate_model(source)
    template = _read_template(chat_template)
    fingerprint = _fingerprint(location, template)
    out = Path(out_root) / _folder_name(source)
    cached = _read_metadata(out)
    if cached and cached.get("fingerprint") == fingerprint and \
            cached.get("linked", True) == link_files:
        return ResolvedModel(out, cached)

    with staged(out) as staging:
        if location.gguf is not None:
            _convert_gguf(location.gguf, staging)
        else:
            _mirror(location, staging, link_files)
        has_template = _apply_chat_template(staging, template, source)
        metadata = {
            "source": str(source), "rule": location.rule,
            "located_at": str(location.gguf or location.model_dir),
            "resolved_path": str(out.resolve()), "chat_template": has_template,
            "chat_template_configured": template is not None, "linked": link_files,
            **_weights_summary(staging), "fingerprint": fingerprint,
        }
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2))
    logger.info("Resolved base model %s (%s) to %s", source, location.rule, out)
    return ResolvedModel(out, metadata)


# ----------------------------------------------------------------------------- locating


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


# ----------------------------------------------------------------------------- building


def _mirror(location: ModelLocation, staging: Path, link_files: bool = True) -> None:
    staging.mkdir()
    for folder in (location.model_dir, location.tokenizer_dir):
        for item in sorted(folder.iterdir()):
            target = staging / item.name
            if item.is_file() and not target.exists() and item.name != METADATA_FILE:
                if link_files:
                    target.symlink_to(item.resolve())
                else:
                    shutil.copyfile(item.resolve(), target)


_GGUF_CONVERSION = 2


def _convert_gguf(gguf: Path, staging: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("Converting %s to safetensors (once; the result is cached)", gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # transformers 5.10 builds the special tokens wrongly from some GGUF files (SmolLM2's
    # eos became <|im_start|>, id 1, while the file says 2, <|im_end|>): generation would then
    # stop at the wrong token. The file's own token ids are the truth; the config has them.
    for attr, token_id in _gguf_special_token_ids(gguf).items():
        setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(token_id))
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))


def _gguf_special_token_ids(gguf: Path) -> dict[str, int]:
    """The tokenizer's special tokens as the GGUF metadata gives them: attribute -> id."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    ids = {}
    for attr, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        field = fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            ids[attr] = int(field.parts[field.data[0]][0])
    return ids


def _apply_chat_template(folder: Path, template: str | None, source: str | Path) -> bool:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if template is not None:
        tokenizer.chat_template = template
        # Tokenizer files may be links into the user's model: replace, never write through.
        for name in TOKENIZER_FILES:
            if (folder / name).is_symlink():
                (folder / name).unlink()
        tokenizer.save_pretrained(str(folder))
        return True
    if not tokenizer.chat_template:
        raise ValueError(
            f"base model {source} has no chat template, and prompts are chat messages. "
            "Configure one: the chat_template argument of the base_model catalog entry (a "
            "Jinja string or a .jinja file), or use an instruct/chat model.")
    return True


def _weights_summary(folder: Path) -> dict[str, Any]:
    from safetensors import safe_open

    files = sorted(p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern))
    params, dtypes, digest = 0, set(), hashlib.sha256()
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    tensor = handle.get_slice(key)
                    params += _numel(tensor.get_shape())
                    dtypes.add(str(tensor.get_dtype()))
        else:
            import torch

            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            params += sum(t.numel() for t in state.values())
            dtypes.update(str(t.dtype).removeprefix("torch.") for t in state.values())
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 23):
                digest.update(chunk)
    return {"parameters": params, "dtype": ",".join(sorted(dtypes)),
            "weight_files": [f.name for f in files], "weights_sha256": digest.hexdigest()}


# ----------------------------------------------------------------------------- helpers


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _read_template(value: str | None) -> str | None:
    if not value:
        return None
    path = Path(value)
    if len(value) < 4096 and path.suffix in (".jinja", ".j2", ".txt") and path.is_file():
        return path.read_text()
    return value


def _fingerprint(location: ModelLocation, template: str | None) -> str:
    # The converter's version: a fix to the GGUF conversion replaces older cached results.
    digest = hashlib.sha256(f"{_GGUF_CONVERSION}|{template or ''}".encode())
    sources = [location.gguf] if location.gguf else [
        *sorted(location.model_dir.iterdir()), *sorted(location.tokenizer_dir.iterdir())]
    for item in sources:
        if item.is_file():
            stat = item.stat()
            digest.update(f"{item.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _folder_name(source: str | Path) -> str:
    # One folder per source: local paths by their absolute form, hub ids as written.
    text = str(Path(source).resolve()) if Path(source).exists() else str(source)
    stem = re.sub(r"[^\w.-]+", "_", Path(text).name or text).strip("_") or "model"
    return f"{stem}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelResolutionError(f"{path}: not readable JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _read_metadata(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / METADATA_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None

