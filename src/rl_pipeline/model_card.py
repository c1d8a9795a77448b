"""What travels with every merged model: a ``SHA256SUMS`` manifest of its files, checked
whenever a later stage loads it, and a ``README.md`` model card in Hugging Face's convention.

The manifest is in ``sha256sum``'s format (``sha256sum -c SHA256SUMS`` checks it by hand). It
covers every file but itself and the card, and a changed, missing or added weight, config or
tokenizer file changes the model and is refused by name. Both are written once, by merge,
in its unpublished work folder; nothing rewrites them after (eval's results go to the
registered version and eval's own run).

The card's YAML front matter is ``huggingface_hub``'s ``ModelCardData`` (``base_model``,
``datasets``, ``tags``, ``library_name``, ``license``), so the folder can be pushed to a hub
as it is, and ``ModelCard.load`` reads it back.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rl_pipeline.errors import UserError
from rl_pipeline.tracking.lineage import weights_run

MANIFEST = "SHA256SUMS"
CARD = "README.md"
_NOT_IN_MANIFEST = {MANIFEST, CARD}


class ManifestError(UserError, ValueError):
    """A model folder's files differ from its manifest; the message names each file."""


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() not in _NOT_IN_MANIFEST)


def write_manifest(folder: str | Path) -> dict[str, str]:
    """Write ``SHA256SUMS`` for every file in ``folder`` (but itself and the card).

    Returns:
        ``{relative path: sha256}``.
    """
    folder = Path(folder)
    sums = {name: file_sha256(folder / name) for name in _files(folder)}
    # The folder is merge's unpublished work folder: the catalog publishes it whole.
    (folder / MANIFEST).write_text("".join(f"{digest}  {name}\n"
                                           for name, digest in sums.items()))
    return sums


def read_manifest(folder: str | Path) -> dict[str, str]:
    """``{relative path: sha256}`` of ``folder``'s manifest.

    Raises:
        ManifestError: When there is none, or a line is not ``<64 hex digits>  <path>``.
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{path}: missing. Every merged model carries one since the merge "
                            "stage writes it; merge the model again (kedro run --pipelines "
                            "merge)")
    sums = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name or any(c not in "0123456789abcdef" for c in digest):
            raise ManifestError(f"{path}, line {number}: expected '<sha256 in hex>  <file>', "
                                f"found {line[:120]!r}")
        sums[name] = digest
    return sums


def check_manifest(folder: str | Path) -> dict[str, str]:
    """Check ``folder``'s files against its manifest.

    Returns:
        ``{relative path: sha256}``, as checked.

    Raises:
        ManifestError: Naming every file that changed, went missing or was added.
    """
    folder = Path(folder)
    expected = read_manifest(folder)
    present = set(_files(folder))
    problems = [f"{name}: missing" for name in sorted(set(expected) - present)]
    problems += [f"{name}: not in the manifest (added after merge)"
                 for name in sorted(present - set(expected))]
    problems += [f"{name}: changed (sha256 {file_sha256(folder / name)[:12]}..., the manifest "
                 f"says {digest[:12]}...)" for name, digest in expected.items()
                 if name in present and file_sha256(folder / name) != digest]
    if problems:
        raise ManifestError(f"{folder} does not match its {MANIFEST} ({len(problems)} "
                            "file(s)); it is not the model that merge wrote and verified:\n"
                            + "\n".join(f"  - {p}" for p in problems))
    return expected


def weight_files(sums: dict[str, str]) -> dict[str, str]:
    """The weight files of a manifest (safetensors shards, or PyTorch bins)."""
    return {name: digest for name, digest in sums.items()
            if name.endswith((".safetensors", ".bin", ".pt"))}


def front_matter(facts: dict[str, Any]) -> Any:
    """The card's metadata: ``huggingface_hub.ModelCardData`` from what merge knows
    (:func:`card_facts`)."""
    from huggingface_hub import ModelCardData

    return ModelCardData(
        base_model=facts["base_model"], datasets=facts["data_sources"] or None,
        tags=["rl_pipeline", facts["engine"], facts["algorithm"]]
        + (["lora"] if facts.get("lora") else []),
        library_name="transformers", license=facts["license"])


def card_facts(metadata: dict[str, Any], name: str, license: str,
               prompts: dict[str, Any]) -> dict[str, Any]:
    """What the card says about training, from merge's metadata and the train run's lineage.

    Args:
        metadata: ``merge_metadata`` (the training result's run summary included).
        name: The registered model's name (or the folder's).
        license: The license to declare (the base model's, usually).
        prompts: ``{"versions": {...}, "rows": {...}, "data_sources": [...]}`` of the
            training prompts, from the train run.
    """
    run = metadata.get("training_run") or {}
    return {
        "name": name, "license": license,
        "base_model": metadata.get("base_model"),
        "engine": run.get("engine", metadata.get("engine", "unknown")),
        "algorithm": run.get("algorithm") or run.get("estimator") or "grpo",
        "steps": run.get("steps"), "lora": metadata.get("lora"),
        "train_run_id": weights_run(run),
        "identity": run.get("identity"),
        "chat_template_kwargs": run.get("chat_template_kwargs") or {},
        "prompts": prompts.get("versions", {}), "rows": prompts.get("rows", {}),
        "data_sources": prompts.get("data_sources") or [],
        "kind": metadata.get("kind"), "dtype": metadata.get("dtype"),
        "verification": metadata.get("verification") or {},
    }


def render_card(facts: dict[str, Any]) -> str:
    """The model card: front matter, then how it was trained, on what, and where its
    evaluation is."""
    lora = facts.get("lora") or {}
    check = facts["verification"]
    weights = (f"LoRA r={lora.get('r')}, alpha={lora.get('lora_alpha')}, merged into the base"
               if lora else "all weights trained")
    lines = [
        "---", front_matter(facts).to_yaml(), "---", "", f"# {facts['name']}", "",
        f"Fine-tuned from `{facts['base_model']}` with reinforcement learning by rl_pipeline.",
        "", "## Training", "",
        f"- engine: {facts['engine']}, estimator: {facts['algorithm']}, steps: "
        f"{facts['steps']}",
        f"- weights: {weights} ({facts['kind']}, {facts['dtype']})",
        f"- train run (MLflow): `{facts['train_run_id']}`, run identity `{facts['identity']}`",
        *([f"- chat template arguments: `{json.dumps(facts['chat_template_kwargs'])}`: it "
           "was trained on prompts made with them; pass them to `apply_chat_template`"]
          if facts.get("chat_template_kwargs") else []),
        "", "## Data", "",
        *[f"- {name}: version `{version}`"
          + (f", {facts['rows'][name]} rows" if name in facts["rows"] else "")
          for name, version in facts["prompts"].items()],
        *([f"- data sources: {', '.join(facts['data_sources'])}"] if facts["data_sources"]
          else []),
        "", "## Merge verification", "",
        f"- {check.get('method', 'logits on probe prompts')}: "
        + ("passed" if check.get("passed") else "not passed")
        + (f", max |logit diff| {check['max_abs_diff']:.3g} (tolerance "
           f"{check['tolerance']:.3g})" if "max_abs_diff" in check else ""),
        "", "## Evaluation", "",
    ]
    lines.append("This folder is never rewritten after merge. Eval's results are on the "
                 "registered model version (MLflow Model Registry, tags `eval.*`) and in the "
                 "eval run's report (`kedro run --pipelines eval`).")
    return "\n".join(lines) + "\n"


def write_card(folder: str | Path, text: str) -> Path:
    """Write the card into ``folder``: merge's unpublished work folder, which the catalog
    publishes whole (a reader never sees a folder without its card, or half a card)."""
    path = Path(folder) / CARD
    path.write_text(text, encoding="utf-8")
    return path


def read_front_matter(folder: str | Path) -> dict[str, Any]:
    """The card's front matter, as a hub reads it (``huggingface_hub.ModelCard``)."""
    from huggingface_hub import ModelCard

    return ModelCard.load(Path(folder) / CARD).data.to_dict()
