"""The train pipeline (preflight, then the trl engine) on an in-memory catalog, tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from rl_pipeline.engines.run_identity import CheckpointRoot
from rl_pipeline.models.identity import model_identity
from rl_pipeline.params import MergeParams, RegistryParams, RewardParams
from rl_pipeline.params.train import TrainParams
from rl_pipeline.pipelines.train import create_pipeline
from rl_pipeline.trained_questions import question_digests, read_trained_questions
from rl_pipeline.training_result import RECORD, TrainingResult
from tests.catalogs import KeptDataset
from tests.conftest import train_catalog

# Slow: the train pipeline runs whole (training) in a Kedro runner.
pytestmark = pytest.mark.slow

TRL = {"apply_lora": True, "lora_rank": 4, "lora_alpha": 8, "num_generations": 4,
       "per_device_train_batch_size": 8, "max_steps": 2,
       "save_steps": 1, "logging_steps": 1, "num_iterations": 1}


def _catalog(model: Path, tmp_path: Path, data_params: dict, trl: dict) -> DataCatalog:
    return train_catalog(model, tmp_path, {"engine": "trl", "trl": trl}, data_params)


def test_train_with_trl_gives_what_merge_takes(tiny_model_dir, tmp_path, data_params) -> None:
    checkpoints = tmp_path / "models" / "train_checkpoints"
    catalog = _catalog(tiny_model_dir, tmp_path, data_params, TRL)
    outputs = SequentialRunner().run(create_pipeline(), catalog)
    report = catalog["preflight_report"].load()
    # The reward self-test ran in the preflight: GSM8K golds score 1, wrong answers lower.
    assert report["engine"] == "trl"
    assert report["reward"]["openai/gsm8k"]["gold_correct"] == 1.0
    assert "per_device_train_batch_size: 8" in outputs["train_config_resolved"].load()
    summary = catalog["train_summary"].load()
    assert summary["engine"] == "trl" and summary["steps"] == 2
    assert summary["base_model"] == model_identity(tiny_model_dir)  # merge and eval check it
    tags = outputs["train_run_tags"].load()
    assert tags["train.engine"] == "trl" and tags["train.identity"] == summary["identity"]
    exported = Path(outputs["training_result"].load())
    assert (exported / "adapter_config.json").is_file()
    result = TrainingResult.read(exported)
    assert (result.kind, result.engine, result.run["steps"]) == ("peft_adapter", "trl", 2)
    # Which questions it trained on travels with it (eval leaves them out).
    assert read_trained_questions(exported) == set(
        question_digests(catalog["train_prompts"].load())) != set(
        question_digests(catalog["val_prompts"].load()))
    # The checkpoints are in the folder of the run's identity, which preflight reported.
    folder = checkpoints / summary["identity"][:12]
    assert summary["checkpoints"] == report["checkpoints"] == str(folder)
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == \
        ["checkpoint-1", "checkpoint-2"]
    assert outputs["train_metrics"].load()["steps"]["value"] == 2.0
    # Preflight's forecast (a calibration with the tiny model) beside the actual time.
    forecast = report["forecast"]
    assert forecast["basis"] == "calibrated on this machine" and forecast["steps"] == 2
    numbers = outputs["train_metrics"].load()
    assert numbers["actual/train_s"]["value"] > 0
    assert numbers["forecast/train_ratio"]["value"] == pytest.approx(
        numbers["actual/train_s"]["value"] / numbers["forecast/train_s"]["value"], rel=1e-3)
    assert isinstance(outputs["reward_curve"].load(), Figure)


def test_full_fine_tuning_with_trl_then_merge_gives_the_trained_model(
        tiny_model_dir, tmp_path, data_params, digit_reward_file) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rl_pipeline.pipelines.merge import create_pipeline as merge_pipeline

    catalog = _catalog(tiny_model_dir, tmp_path, data_params,
                       {**TRL, "apply_lora": False, "max_steps": 1, "learning_rate": 1e-2,
                        "warmup_ratio": 0.0})
    # A reward that varies within a group, so that one step has advantages to follow. It is
    # no correctness reward (a perfect answer does not score 1): the self-test only warns.
    catalog["params:reward"] = RewardParams(
        custom_reward_function={"path": str(digit_reward_file), "name": "score"},
        self_test="warn")
    catalog["params:merge"] = MergeParams(dtype="bfloat16")
    catalog["params:registry"] = RegistryParams(model_name=None)  # no registry here
    # The merge pipeline's publish node reads both: kept for the test after it has.
    catalog["merged_model"], catalog["merge_metadata"] = KeptDataset(), KeptDataset()
    outputs = SequentialRunner().run(create_pipeline() + merge_pipeline(), catalog)
    assert outputs["registered_model"].load()["registered"] is False
    merged = Path(catalog["merged_model"].load())
    metadata = catalog["merge_metadata"].load()
    assert (merged / "README.md").is_file() and (merged / "SHA256SUMS").is_file()
    trained = Path(metadata["training_result"])  # train's output: the whole model
    assert metadata["kind"] == "hf_model" and (trained / "model.safetensors").is_file()
    assert not (trained / "adapter_config.json").exists()
    assert metadata["training_run"]["steps"] == 1 and metadata["training_run"]["lora"] is False
    assert metadata["verification"]["passed"] and metadata["dtype"] == "bfloat16"
    # The card names the data sources it was trained on (Hugging Face's `datasets`).
    assert metadata["training_run"]["data_sources"] == ["openai/gsm8k"]
    assert "datasets:\n- openai/gsm8k" in (merged / "README.md").read_text()
    assert not (merged / RECORD).exists()

    ids = torch.tensor([[1, 5, 9, 14, 3]])
    with torch.inference_mode():
        logits = {name: AutoModelForCausalLM.from_pretrained(str(path)).eval()(
            input_ids=ids).logits.float() for name, path in
            (("base", tiny_model_dir), ("trained", trained), ("merged", merged))}
    assert AutoModelForCausalLM.from_pretrained(str(merged)).dtype == torch.bfloat16
    # The merged model is the trained one (to bfloat16 precision), and training changed it.
    assert torch.allclose(logits["merged"], logits["trained"], rtol=4e-2, atol=4e-2)
    assert (logits["trained"] - logits["base"]).abs().max() > 1e-3


def _run(catalog: DataCatalog) -> dict:
    SequentialRunner().run(create_pipeline(), catalog)
    return catalog["train_summary"].load()


def test_a_rerun_trains_a_new_model_only_when_its_identity_changed(
        tiny_model_dir, tmp_path, data_params) -> None:
    """The measured scenario of issue 17: a rerun used to resume the old run in one fixed
    folder, past max_steps at learning rate 0, and never took a changed learning rate."""
    root = tmp_path / "models" / "train_checkpoints"
    trl = {**TRL, "lr_scheduler_type": "linear", "warmup_ratio": 0.0, "learning_rate": 1e-3}
    catalog = _catalog(tiny_model_dir, tmp_path, data_params, trl)
    first = _run(catalog)
    assert catalog["preflight_report"].load()["forecast"]["step_s"]["total"] > 0
    folder = Path(first["checkpoints"])
    assert (first["steps"], first["resumed"], first["already_complete"]) == (2, False, False)
    saved = {p.name: p.stat().st_mtime_ns for p in folder.glob("checkpoint-*/*.safetensors")}

    # The same configuration again: complete, so no step runs and nothing is rewritten,
    # and preflight spends no calibration on forecasting it.
    catalog = _catalog(tiny_model_dir, tmp_path, data_params, trl)
    again = _run(catalog)
    assert catalog["preflight_report"].load()["forecast"] == {
        "basis": f"none: the run in {folder} is complete (step 2 of 2), so train only "
                 "exports it again"}
    assert (again["identity"], again["checkpoints"]) == (first["identity"], str(folder))
    assert (again["steps"], again["already_complete"], again["resumed"]) == (2, True, True)
    assert again["seconds"] == 0.0
    assert {p.name: p.stat().st_mtime_ns
            for p in folder.glob("checkpoint-*/*.safetensors")} == saved

    # Another learning rate: another identity, trained from the base at the new rate.
    changed = _run(_catalog(tiny_model_dir, tmp_path, data_params,
                            {**trl, "learning_rate": 5e-4}))
    assert changed["identity"] != first["identity"]
    assert (changed["steps"], changed["resumed_from_step"], changed["resumed"]) == (2, 0, False)
    # Half the rate at every step of the same schedule, from step 1: not the old run's tail.
    old_rates = _learning_rates(folder)
    assert sorted(old_rates) == [1, 2] and old_rates[1] > 0
    assert _learning_rates(Path(changed["checkpoints"])) == pytest.approx(
        {step: rate / 2 for step, rate in old_rates.items()})
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == sorted(
        [first["identity"][:12], changed["identity"][:12]])  # hidden: the identities' locks

    # Killed (or out of disk) while saving its last checkpoint: transformers writes the
    # trainer state last, truncating it first. The rerun resumes from the one before, where
    # it took the half-written one and failed (on a missing file, then on an empty one).
    (Path(changed["checkpoints"]) / "checkpoint-2" / "trainer_state.json").write_text("")
    resumed = _run(_catalog(tiny_model_dir, tmp_path, data_params,
                            {**trl, "learning_rate": 5e-4}))
    assert (resumed["steps"], resumed["resumed_from_step"], resumed["resumed"]) == (2, 1, True)
    assert (Path(changed["checkpoints"]) / "checkpoint-2" / "trainer_state.json").is_file()

    # train.resume=never trains the first identity afresh.
    catalog = _catalog(tiny_model_dir, tmp_path, data_params, trl)
    catalog["params:train"] = TrainParams.model_validate(
        {"engine": "trl", "trl": trl, "resume": "never"})
    SequentialRunner().run(create_pipeline(), catalog)
    retrained = catalog["train_summary"].load()
    assert (retrained["steps"], retrained["already_complete"], retrained["resumed"]) == \
        (2, False, False)


def test_only_the_last_identities_are_kept(tiny_model_dir, tmp_path, data_params) -> None:
    trl = {**TRL, "max_steps": 1, "save_steps": 1}
    for rate in (1e-3, 2e-3, 3e-3):
        catalog = _catalog(tiny_model_dir, tmp_path, data_params, {**trl, "learning_rate": rate})
        catalog["train_checkpoints_dir"] = MemoryDataset(CheckpointRoot(
            str(tmp_path / "models" / "train_checkpoints"), keep_identities=2))
        last = _run(catalog)
    root = tmp_path / "models" / "train_checkpoints"
    kept = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    assert len(kept) == 2 and Path(last["checkpoints"]) in kept
    # Each kept identity's lock file, hidden beside it; the deleted one's went with it.
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == sorted(
        f".{p.name}.lock" for p in kept)


def _learning_rates(folder: Path) -> dict[int, float]:
    newest = max(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((newest / "trainer_state.json").read_text())
    return {h["step"]: h["learning_rate"] for h in state["log_history"] if "learning_rate" in h}
