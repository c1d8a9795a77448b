"""The SHA256SUMS manifest every merged model carries (a changed file is refused by name) and
its model card in Hugging Face's convention."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest
import yaml

from rl_pipeline.model_card import (
    CARD,
    MANIFEST,
    ManifestError,
    card_facts,
    check_manifest,
    read_front_matter,
    render_card,
    weight_files,
    write_card,
    write_manifest,
)


@pytest.fixture
def model(tiny_model_dir, tmp_path):
    folder = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, folder)
    write_manifest(folder)
    return folder


def test_the_manifest_is_sha256sums_format_and_checks_by_hand(model) -> None:
    lines = (model / MANIFEST).read_text().splitlines()
    digest, name = lines[0].split("  ")
    assert digest == hashlib.sha256((model / name).read_bytes()).hexdigest()
    assert {line.split("  ")[1] for line in lines} >= {"config.json", "model.safetensors"}
    # The coreutils tool agrees: the manifest is checkable without this project.
    checked = subprocess.run(["sha256sum", "-c", MANIFEST], cwd=model, capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert set(weight_files(check_manifest(model))) == {"model.safetensors"}


def test_a_tampered_weight_file_is_refused_by_name(model) -> None:
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"model\.safetensors: changed \(sha256 "):
        check_manifest(model)


def test_missing_and_added_files_are_named(model) -> None:
    (model / "tokenizer.json").unlink()
    (model / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(ManifestError) as failure:
        check_manifest(model)
    message = str(failure.value)
    assert "tokenizer.json: missing" in message
    assert "extra.safetensors: not in the manifest" in message


def test_the_card_is_outside_the_manifest(model) -> None:
    write_card(model, "---\nlicense: other\n---\n# card\n")
    assert check_manifest(model)  # documentation, not the model: outside its files' sums
    assert MANIFEST not in (model / MANIFEST).read_text() and CARD not in (
        model / MANIFEST).read_text()


def test_a_malformed_manifest_names_its_line(model) -> None:
    (model / MANIFEST).write_text("abc  config.json\n")
    with pytest.raises(ManifestError, match=r"SHA256SUMS, line 1: expected"):
        check_manifest(model)
    (model / MANIFEST).unlink()
    with pytest.raises(ManifestError, match="SHA256SUMS: missing"):
        check_manifest(model)


METADATA = {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "kind": "peft_adapter",
            "dtype": "bfloat16", "lora": {"r": 16, "lora_alpha": 32},
            "verification": {"passed": True, "max_abs_diff": 0.01, "tolerance": 0.04},
            "training_run": {"engine": "trl", "algorithm": "grpo", "steps": 40,
                             "mlflow_run_id": "abc", "identity": "f" * 64}}
def test_the_card_has_hugging_faces_front_matter(tmp_path) -> None:
    facts = card_facts(METADATA, "rl_pipeline", "apache-2.0",
                       {"versions": {"train_prompts": "2026-11-24T22.00.00.000Z"},
                        "rows": {"train_prompts": 600},
                        "data_sources": ["rl_pipeline/arithmetic"]})
    write_card(tmp_path, render_card(facts))
    meta = read_front_matter(tmp_path)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["library_name"] == "transformers" and meta["license"] == "apache-2.0"
    assert meta["datasets"] == ["rl_pipeline/arithmetic"]
    assert meta["tags"] == ["rl_pipeline", "trl", "grpo", "lora"]
    text = (tmp_path / CARD).read_text()
    assert "engine: trl, estimator: grpo, steps: 40" in text
    assert "train_prompts: version `2026-11-24T22.00.00.000Z`, 600 rows" in text
    assert "max |logit diff| 0.01 (tolerance 0.04)" in text
    assert "Eval's results are on the registered model version" in text
    # Valid YAML between the fences, as the Hub parses it.
    assert yaml.safe_load(text.split("---\n")[1]) == meta
