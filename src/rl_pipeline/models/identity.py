"""A model folder by content, and the check that a model was trained from the base model a
stage is given.

Train records its base model's identity in its result; merge folds an adapter into
``base_model`` and eval compares the merged model with ``base_model``. Run stage by stage,
``base_model`` may have changed between them (the next experiment's model set before the
last one was merged): merge would then fold the adapter into weights it was not trained on,
and verify the result against the same wrong base, so nothing would fail; eval would compare
the model with a base it did not start from, and the gate would promote on that.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from rl_pipeline.errors import UserError
from rl_pipeline.models.resolve import METADATA_FILE
from rl_pipeline.runs.jsonfile import read_object

# Files that shape tokenization and the chat template, read by content.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model")
# The keys of model_identity that say which weights a folder holds.
_WEIGHTS_KEYS = ("weights_sha256", "files_sha256")


class BaseModelMismatchError(UserError, ValueError):
    """A model trained from one base model, handed to a stage with another."""


def model_identity(folder: Path) -> dict[str, Any]:
    """A model folder by content: the weights' digest that resolving it recorded (hashing
    gigabytes again on every run would cost minutes), else every file's; and its tokenizer."""
    metadata = read_object(folder / METADATA_FILE)
    out: dict[str, Any] = {"tokenizer_sha256": files_sha256(
        [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()])}
    if metadata.get("weights_sha256"):
        out.update(source=metadata.get("source"), weights_sha256=metadata["weights_sha256"])
    else:
        out["files_sha256"] = files_sha256(sorted(p for p in folder.rglob("*") if p.is_file()))
    return out


def files_sha256(paths: list[Path]) -> str:
    """One digest over several files' names and contents."""
    # Read in chunks: hashlib.file_digest hashes one file alone, and another scheme would
    # change every run identity (and so every resume) computed before.
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 23):
                digest.update(chunk)
    return digest.hexdigest()


def check_trained_from(recorded: dict[str, Any] | None, base_model: str | Path, what: str,
                       remedy: str) -> None:
    """Refuse ``base_model`` when it holds other weights than the base model ``what`` was
    trained from (``recorded``, train's :func:`model_identity` of it).

    Nothing is refused when nothing was recorded (a result from before the record), or when
    the two were taken differently (one from resolving's digest, one from the files): the
    weights cannot be compared then without hashing them all again.

    Raises:
        BaseModelMismatchError: Naming both models, ``base_model`` and ``remedy``.
    """
    if not recorded:
        return
    current = model_identity(Path(base_model))
    key = next((k for k in _WEIGHTS_KEYS if k in recorded and k in current), None)
    if key is None or recorded[key] == current[key]:
        return
    trained = recorded.get("source") or "a model"
    raise BaseModelMismatchError(
        f"{what} was trained from {trained} (weights sha256 {recorded[key][:12]}), but "
        f"base_model is now {current.get('source') or base_model} ({current[key][:12]}). "
        f"{remedy + ' ' if remedy else ''}Set base_model back to the model it was trained from"
        f"{f' (--params base_model={trained})' if recorded.get('source') else ''}, or train "
        "again from this one.")
