"""Turn any model input into a normal Hugging Face model folder, with a metadata file (cached).

:func:`resolve_model` is the entry point: it locates the model
(:mod:`rl_pipeline.models.locate`), and reuses the resolved folder built for the same source
before, or materialises a new one (:mod:`rl_pipeline.models.materialise`) that
``from_pretrained`` loads. A GGUF file is thus converted once.

Each resolved folder carries ``model_metadata.json``: the source, the rule that found the
model, the parameter count, the dtype, whether there is a chat template, and a hash of the
weights. A fingerprint of the located files and the chat template decides whether the folder
is reused. Folders are built under a temporary name and renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_pipeline.models.locate import ModelLocation, ModelResolutionError, locate_model
from rl_pipeline.models.materialise import (
    GGUF_CONVERSION,
    apply_chat_template,
    convert_gguf,
    mirror,
    read_template,
    weights_summary,
)
from rl_pipeline.runs.staging import staged

# folders.resolved_models of conf/base/globals.yml (which the catalog's base_model reads),
# for a model resolved outside the catalog: the judge model, from reward.judge.model. A test
# (tests/models/test_resolve.py) holds the two equal.
RESOLVED_DIR = "data/06_models/resolved"

logger = logging.getLogger(__name__)

METADATA_FILE = "model_metadata.json"


@dataclass(frozen=True)
class ResolvedModel:
    """A normal Hugging Face model folder made from a model input."""

    path: Path
    metadata: dict[str, Any]


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
    template = read_template(chat_template)
    fingerprint = _fingerprint(location, template)
    out = Path(out_root) / _folder_name(source)
    cached = _read_metadata(out)
    if cached and cached.get("fingerprint") == fingerprint and \
            cached.get("linked", True) == link_files:
        return ResolvedModel(out, cached)

    with staged(out) as staging:
        if location.gguf is not None:
            try:
                convert_gguf(location.gguf, staging)
            except (ValueError, KeyError, EOFError) as exc:  # gguf's reader on a bad file
                raise ModelResolutionError(
                    f"{location.gguf}: not a GGUF model that transformers can read (a "
                    f"truncated download, or another format?): {exc}") from exc
        else:
            mirror(location, staging, link_files, skip=METADATA_FILE)
        has_template = apply_chat_template(staging, template, source)
        metadata = {
            "source": str(source), "rule": location.rule,
            "located_at": str(location.gguf or location.model_dir),
            "resolved_path": str(out.resolve()), "chat_template": has_template,
            "chat_template_configured": template is not None, "linked": link_files,
            **weights_summary(staging), "fingerprint": fingerprint,
        }
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2))
    logger.info("Resolved base model %s (%s) to %s", source, location.rule, out)
    return ResolvedModel(out, metadata)


def _fingerprint(location: ModelLocation, template: str | None) -> str:
    # The converter's version: a fix to the GGUF conversion replaces older cached results.
    digest = hashlib.sha256(f"{GGUF_CONVERSION}|{template or ''}".encode())
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


def _read_metadata(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / METADATA_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
