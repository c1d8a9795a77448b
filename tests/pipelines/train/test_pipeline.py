"""The train pipeline (preflight, then the trl engine) on an in-memory catalog, tiny model."""

from __future__ import annotations

import json
from pathlib import Path

from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from rl_pipeline.config import MergeParams, RewardParams
from rl_pipeline.engines import TRAINING_RUN
from rl_pipeline.pipelines.train import create_pipeline
from tests.conftest import train_catalog

TRL = {"apply_lora": True, "lora_rank": 4, "lora_alpha": 8, "num_generations": 4,
       "per_device_train_batch_size": 8, "max_steps": 2,
       "save_steps": 1, "logging_steps": 1, "num_iterations": 1}


def _catalog(model: Path, tmp_path: Path, data_params: dict, trl: dict) -> DataCatalog:
    return train_catalog(model, tmp_path, {"engine": "trl", "trl": trl}, data_params)


def test_train_with_trl_gives_what_merge_takes(tiny_model_dir, tmp_path, data_params) -> None:
    checkpoints = tmp_path / "models" / "train_checkpoints"
    outputs = SequentialRunner().run(create_pipeline(),
                                     _catalog(tiny_model_dir, tmp_path, data_params, TRL))
    report = outputs["preflight_report"].load()
    assert report["engine"] == "trl" and report["reward"]["reference_mean"] == 1.0
    assert "per_device_train_batch_size: 8" in outputs["train_config_resolved"].load()
    summary = outputs["train_summary"].load()
    assert summary["engine"] == "trl" and summary["steps"] == 2
    adapter = Path(outputs["lora_adapter"].load())
    assert (adapter / "adapter_config.json").is_file()
    assert json.loads((adapter / TRAINING_RUN).read_text())["steps"] == 2
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == \
        ["checkpoint-1", "checkpoint-2"]
    assert outputs["train_metrics"].load()["steps"]["value"] == 2.0
    assert isinstance(outputs["reward_curve"].load(), Figure)


def test_full_fine_tuning_with_trl_then_merge_gives_the_trained_model(
        tiny_model_dir, tmp_path, data_params, digit_reward_file) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rl_pipeline.pipelines.merge import create_pipeline as merge_pipeline

    catalog = _catalog(tiny_model_dir, tmp_path, data_params,
                       {**TRL, "apply_lora": False, "max_steps": 1, "learning_rate": 1e-2,
                        "warmup_ratio": 0.0})
    # A reward that varies within a group, so that one step has advantages to follow.
    catalog["params:reward"] = RewardParams(
        custom_reward_function={"path": str(digit_reward_file), "name": "score"})
    catalog["train_checkpoints"] = MemoryDataset(None)
    catalog["params:merge"] = MergeParams(scratch_dir=str(tmp_path / "scratch"),
                                          dtype="bfloat16")
    outputs = SequentialRunner().run(create_pipeline() + merge_pipeline(), catalog)
    merged = Path(outputs["merged_model"].load())
    metadata = outputs["merge_metadata"].load()
    trained = Path(metadata["full_model"])  # train's lora_adapter output: the whole model
    assert metadata["adapter"] is None and (trained / "model.safetensors").is_file()
    assert not (trained / "adapter_config.json").exists()
    assert metadata["training_run"]["steps"] == 1 and metadata["training_run"]["lora"] is False
    assert metadata["verification"]["passed"] and metadata["dtype"] == "bfloat16"
    assert not (merged / TRAINING_RUN).exists()

    ids = torch.tensor([[1, 5, 9, 14, 3]])
    with torch.inference_mode():
        logits = {name: AutoModelForCausalLM.from_pretrained(str(path)).eval()(
            input_ids=ids).logits.float() for name, path in
            (("base", tiny_model_dir), ("trained", trained), ("merged", merged))}
    assert AutoModelForCausalLM.from_pretrained(str(merged)).dtype == torch.bfloat16
    # The merged model is the trained one (to bfloat16 precision), and training changed it.
    assert torch.allclose(logits["merged"], logits["trained"], rtol=4e-2, atol=4e-2)
    assert (logits["trained"] - logits["base"]).abs().max() > 1e-3
