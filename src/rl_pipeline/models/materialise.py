"""Materialising a located model: building the folder that ``from_pretrained`` loads.

Given a :class:`~rl_pipeline.models.locate.ModelLocation`, these fill a staging folder:

* an existing folder is mirrored with symbolic links (no copy of the weights);
* a GGUF file is dequantized by transformers and saved as safetensors;
* a separate tokenizer folder (MLflow layouts) is linked in beside the weights;
* a configured chat template is written into the tokenizer config.

They also summarise the weights written (parameter count, dtype, hash) for the metadata.
Where the folder lives, and whether it is rebuilt, is :mod:`rl_pipeline.models.resolve`'s.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any

from rl_pipeline.models.locate import WEIGHT_PATTERNS, ModelLocation

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "merges.txt", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")

# The converter's version, part of the resolved folder's fingerprint: raise it when a fix
# to the GGUF conversion should replace older cached results.
GGUF_CONVERSION = 2


def mirror(location: ModelLocation, staging: Path, link_files: bool = True, *,
           skip: str) -> None:
    """Link (or copy) the model's files, then the tokenizer's, into ``staging``.

    A file named ``skip`` (the source's own metadata file, when it is a resolved folder) is
    left out.
    """
    staging.mkdir()
    for folder in (location.model_dir, location.tokenizer_dir):
        for item in sorted(folder.iterdir()):
            target = staging / item.name
            if item.is_file() and not target.exists() and item.name != skip:
                if link_files:
                    target.symlink_to(item.resolve())
                else:
                    shutil.copyfile(item.resolve(), target)


def convert_gguf(gguf: Path, staging: Path) -> None:
    """Dequantize a GGUF file into a safetensors model folder at ``staging``."""
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


def read_template(value: str | None) -> str | None:
    """A configured chat template: the text of a ``.jinja`` (``.j2``, ``.txt``) file, or
    ``value`` itself."""
    if not value:
        return None
    path = Path(value)
    if len(value) < 4096 and path.suffix in (".jinja", ".j2", ".txt") and path.is_file():
        return path.read_text()
    return value


def apply_chat_template(folder: Path, template: str | None, source: str | Path) -> bool:
    """Write ``template`` into the folder's tokenizer, or check that it has one.

    Raises:
        ValueError: If the model has no chat template and none is configured.
    """
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


def weights_summary(folder: Path) -> dict[str, Any]:
    """The folder's weights: parameter count, dtypes, file names and a SHA-256 of them."""
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


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
