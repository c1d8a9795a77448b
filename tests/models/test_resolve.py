"""The model resolver: every layout becomes a loadable Hugging Face folder with metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_pipeline.models.locate import ModelResolutionError
from rl_pipeline.models.resolve import METADATA_FILE, RESOLVED_DIR, resolve_model
from tests.conftest import PROJECT_ROOT, SMOLLM2_GGUF


def _assert_loadable(folder: Path, reference: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    ref = AutoModelForCausalLM.from_pretrained(str(reference))
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(model(ids).logits, ref(ids).logits)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.chat_template
    metadata = json.loads((folder / METADATA_FILE).read_text())
    assert metadata["parameters"] == ref.num_parameters()
    assert metadata["dtype"] == "F32" and metadata["chat_template"] is True
    assert len(metadata["weights_sha256"]) == 64
    return metadata


def _hub_cache(monkeypatch, cache: Path) -> None:
    # huggingface_hub reads its settings into constants at import; set those too.
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _copy_model(src: Path, dst: Path, tokenizer: bool = True) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if tokenizer or not f.name.startswith(("tokenizer", "chat_template", "special")):
            shutil.copy(f, dst / f.name)
    return dst


def test_plain_hf_folder(tiny_model_dir, tmp_path) -> None:
    resolved = resolve_model(tiny_model_dir, tmp_path / "out")
    metadata = _assert_loadable(resolved.path, tiny_model_dir)
    assert metadata["rule"] == "hf_folder"
    assert (resolved.path / "model.safetensors").is_symlink()  # mirrored, not copied


def test_model_selector_layout_two_levels_deep(tiny_model_dir, tmp_path) -> None:
    root = tmp_path / "import_out"
    _copy_model(tiny_model_dir, root / "Qwen" / "Tiny-Instruct")
    (root / "model_selector_args.json").write_text(json.dumps(
        {"model_name": "Qwen/Tiny-Instruct", "task_name": "ChatCompletion"}))
    (root / "finetune_config.json").write_text("{}")
    resolved = resolve_model(root, tmp_path / "out")
    assert _assert_loadable(resolved.path, tiny_model_dir)["rule"] == "model_selector_args"


def test_model_import_metadata_layout(tiny_model_dir, tmp_path) -> None:
    local = _copy_model(tiny_model_dir, tmp_path / "snapshot")
    root = tmp_path / "lite"
    root.mkdir()
    (root / "model_import_metadata.json").write_text(json.dumps(
        {"success": True, "model_id": "org/tiny", "local_dir": str(local)}))
    resolved = resolve_model(root, tmp_path / "out")
    assert _assert_loadable(resolved.path, tiny_model_dir)["rule"] == "model_import_metadata"


def test_mlflow_transformers_flavour(tiny_model_dir, tmp_path) -> None:
    import mlflow

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    root = tmp_path / "mlflow_model"
    mlflow.transformers.save_model({"model": model, "tokenizer": tokenizer}, str(root),
                                   task="text-generation",
                                   pip_requirements=["transformers", "torch"])
    assert (root / "MLmodel").is_file()
    resolved = resolve_model(root, tmp_path / "out")
    assert _assert_loadable(resolved.path, tiny_model_dir)["rule"] == "mlflow_transformers"


def test_azure_hftransformersv2_flavour(tiny_model_dir, tmp_path) -> None:
    root = tmp_path / "azure_mlflow"
    _copy_model(tiny_model_dir, root / "data" / "model", tokenizer=False)
    tok = root / "data" / "tokenizer"
    tok.mkdir()
    for f in tiny_model_dir.glob("tokenizer*"):
        shutil.copy(f, tok / f.name)
    if (tiny_model_dir / "chat_template.jinja").exists():
        shutil.copy(tiny_model_dir / "chat_template.jinja", tok)
    (root / "MLmodel").write_text(yaml.safe_dump({"flavors": {"hftransformersv2": {
        "huggingface_id": "org/tiny", "task_type": "chat-completion", "model_data": "data"}}}))
    resolved = resolve_model(root, tmp_path / "out")
    assert _assert_loadable(resolved.path, tiny_model_dir)["rule"] == "mlflow_hftransformersv2"


def test_nested_folder_found_by_search(tiny_model_dir, tmp_path) -> None:
    root = tmp_path / "outputs"
    _copy_model(tiny_model_dir, root / "run1" / "final")
    resolved = resolve_model(root, tmp_path / "out")
    assert _assert_loadable(resolved.path, tiny_model_dir)["rule"] == "search"


def test_hub_id_from_the_local_cache(tiny_model_dir, tmp_path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--tiny-chat" / "snapshots" / "0123abc"
    _copy_model(tiny_model_dir, snapshot)
    (cache / "models--org--tiny-chat" / "refs").mkdir()
    (cache / "models--org--tiny-chat" / "refs" / "main").write_text("0123abc")
    _hub_cache(monkeypatch, cache)
    resolved = resolve_model("org/tiny-chat", tmp_path / "out")
    assert _assert_loadable(resolved.path, tiny_model_dir)["rule"] == "hub_id"


def test_hub_id_offline_and_not_cached_names_it_and_what_to_do(tmp_path, monkeypatch) -> None:
    _hub_cache(monkeypatch, tmp_path / "empty")
    with pytest.raises(ModelResolutionError) as err:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "out")
    assert "'Qwen/Qwen2.5-0.5B-Instruct'" in str(err.value)
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir" in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "not_gguf"])
def test_a_damaged_gguf_file_is_named_and_leaves_nothing_resolved(tmp_path, damage) -> None:
    """gguf's reader raised a bare ValueError (a reshape, a bad magic) from deep inside
    transformers: a traceback that named no file."""
    bad = tmp_path / "model.gguf"
    data = Path(SMOLLM2_GGUF).read_bytes()
    bad.write_bytes(data[:3_000_000] if damage == "truncated" else b"\x00" * 4096)
    with pytest.raises(ModelResolutionError) as err:
        resolve_model(bad, tmp_path / "out")
    assert str(err.value).startswith(f"{bad}: not a GGUF model that transformers can read "
                                     "(a truncated download, or another format?): ")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


@pytest.mark.slow
def test_gguf_file_is_converted_to_safetensors(resolved_cache) -> None:
    # Into the session's cache, as the fixtures and kedro runs resolve it: converted here, or
    # earlier in the session by the same call (half a minute on 2 cores, not paid twice).
    resolved = resolve_model(SMOLLM2_GGUF, resolved_cache)
    assert (resolved.path / "model.safetensors").is_file()
    assert resolved.metadata["rule"] == "gguf_file"
    assert resolved.metadata["parameters"] == 134_515_008  # SmolLM2-135M
    tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
    assert "<|im_start|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)
    # Special tokens as the GGUF file declares them (transformers' converter gets eos wrong):
    # a chat turn ends at <|im_end|>, and the tokenizer and the model config agree on it.
    config = json.loads((resolved.path / "config.json").read_text())
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.bos_token == "<|im_start|>"
    assert tokenizer.eos_token_id == config["eos_token_id"] == 2
    assert tokenizer.pad_token_id == config["pad_token_id"]
    again = resolve_model(SMOLLM2_GGUF, resolved_cache)  # cached: no second conversion
    assert again.metadata["fingerprint"] == resolved.metadata["fingerprint"]


def test_missing_model_lists_what_was_looked_for(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelResolutionError) as err:
        resolve_model(tmp_path / "empty", tmp_path / "out")
    message = str(err.value)
    for looked_for in ("config.json with weights", "model_selector_args.json", "MLmodel",
                       "model_import_metadata.json", ".gguf"):
        assert looked_for in message
    with pytest.raises(ModelResolutionError, match="not an existing file or folder"):
        resolve_model(tmp_path / "nowhere" / "model", tmp_path / "out")


def test_ambiguous_folder_lists_the_candidates(tiny_model_dir, tmp_path) -> None:
    root = tmp_path / "two"
    _copy_model(tiny_model_dir, root / "a")
    _copy_model(tiny_model_dir, root / "b")
    with pytest.raises(ModelResolutionError) as err:
        resolve_model(root, tmp_path / "out")
    assert "2 model folders" in str(err.value)
    assert str(root / "a") in str(err.value) and str(root / "b") in str(err.value)


def test_model_without_chat_template_is_refused_unless_one_is_configured(
        tiny_model_dir, tmp_path) -> None:
    bare = _copy_model(tiny_model_dir, tmp_path / "bare")
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    before = (bare / "tokenizer_config.json").read_text()
    with pytest.raises(ValueError, match="has no chat template"):
        resolve_model(bare, tmp_path / "out")

    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                        "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    resolved = resolve_model(bare, tmp_path / "out", chat_template=str(template))
    tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}],
                                         tokenize=False).endswith("<|im_start|>assistant")
    assert resolved.metadata["chat_template_configured"] is True
    assert (bare / "tokenizer_config.json").read_text() == before  # the input is untouched


def test_copies_instead_of_links_for_shared_storage(tiny_model_dir, tmp_path) -> None:
    """A Ray cluster's other nodes cannot follow links into the driver's own folders."""
    linked = resolve_model(tiny_model_dir, tmp_path / "out")
    copied = resolve_model(tiny_model_dir, tmp_path / "out", link_files=False)
    assert copied.path == linked.path  # the same folder, re-resolved
    files = [p for p in copied.path.iterdir() if p.is_file()]
    assert files and not any(p.is_symlink() for p in files)
    assert copied.metadata["linked"] is False
    _assert_loadable(copied.path, tiny_model_dir)


def test_a_model_resolved_outside_the_catalog_goes_where_the_catalogs_do() -> None:
    folders = yaml.safe_load((PROJECT_ROOT / "conf/base/globals.yml").read_text())["folders"]
    assert folders["resolved_models"] == RESOLVED_DIR
