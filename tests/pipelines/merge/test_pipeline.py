"""`kedro run --pipelines merge`: a verified, versioned merged model, logged to MLflow; and a
merge killed midway that leaves nothing loadable behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from kedro.io import Version
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rl_pipeline.datasets.model_folder import ModelFolderDataset
from rl_pipeline.models.resolve import resolve_model
from rl_pipeline.testing import train_tiny_lora
from rl_pipeline.trained_questions import FILE as TRAINED_QUESTIONS
from rl_pipeline.trained_questions import (
    question_digests,
    read_trained_questions,
    write_trained_questions,
)
from rl_pipeline.training_result import TrainingResult
from tests.conftest import gsm8k_prompts
from tests.projects import kedro_run, make_project, mlflow_runs

pytestmark = pytest.mark.slow


def _stage_adapter(project: Path, adapter: Path) -> None:
    import shutil

    staged = project / "adapter_copy"
    shutil.copytree(adapter, staged)
    TrainingResult(kind="peft_adapter", engine="trl", run={"steps": 1}).write(staged)
    write_trained_questions(staged, gsm8k_prompts(3))
    ModelFolderDataset(path=str(project / "data/06_models/training_result"),
                       version=Version(None, None)).save(str(staged))


def _merged(project: Path) -> str | None:
    return ModelFolderDataset(path=str(project / "data/06_models/merged_model"),
                              version=Version(None, None), optional=True).load()


def test_merge_run_writes_a_verified_model_and_logs_it(tiny_model_dir, tmp_path) -> None:
    project = make_project(tmp_path)
    adapter = train_tiny_lora(tiny_model_dir, tmp_path / "adapter")
    _stage_adapter(project, adapter)
    result = kedro_run(project, "--pipelines", "merge", "--params",
                       f"base_model={tiny_model_dir},registry.model_name=tiny-merged,"
                       "registry.copy_weights=true")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    merged = Path(_merged(project))
    ids = torch.tensor([[5, 9, 30, 77]])
    with torch.inference_mode():
        ours = AutoModelForCausalLM.from_pretrained(str(merged))(ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        reference = PeftModel.from_pretrained(base, str(adapter))(ids).logits
    assert torch.allclose(ours, reference, atol=1e-4)
    assert resolve_model(merged, tmp_path / "resolved").metadata["rule"] == "hf_folder"
    assert not list((project / "data/06_models").glob(".merge-*"))  # moved, not copied

    client, (run,) = mlflow_runs(project)
    assert run.info.run_name == "merge" and run.info.status == "FINISHED"
    assert run.data.metrics["merge.max_abs_diff"] < run.data.metrics["merge.tolerance"]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "merge")} == {
        "merge/merge_metadata.json", "merge/registered_model.json"}
    # registry.copy_weights: the version is the weights logged to the merge run, tagged with
    # where the catalog keeps the folder and the hash of its weights.
    (version,) = client.search_model_versions("name='tiny-merged'")
    assert version.run_id == run.info.run_id and version.source.startswith("models:/")
    assert version.tags["storage"] == "mlflow copy"
    # Relative to the project, so that it holds where the project lies elsewhere.
    assert version.tags["catalog.path"] == merged.relative_to(project).as_posix()
    assert version.tags["sha256.model.safetensors"] in (merged / "SHA256SUMS").read_text()
    assert (merged / "README.md").read_text().startswith("---\nbase_model: ")
    metadata = json.loads((merged / "merge_metadata.json").read_text())
    assert metadata["verification"]["passed"] and metadata["adapter"].endswith("training_result")
    # The questions it was trained on, with the model and under its manifest.
    assert read_trained_questions(merged) == set(question_digests(gsm8k_prompts(3)))
    assert TRAINED_QUESTIONS in (merged / "SHA256SUMS").read_text()
