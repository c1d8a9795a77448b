"""The train pipeline (preflight, then the trl engine) on an in-memory catalog, tiny model."""

from __future__ import annotations

import json
from pathlib import Path

from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from rl_pipeline.engines import TRAINING_RUN
from rl_pipeline.pipelines.train import create_pipeline
from tests.conftest import GSM8K_TEST, gsm8k_prompts

TRL = {"apply_lora": True, "lora_rank": 4, "lora_alpha": 8, "num_generations": 4,
       "per_device_train_batch_size": 8, "max_completion_length": 8, "max_steps": 2,
       "save_steps": 1, "logging_steps": 1, "num_iterations": 1}


def test_train_with_trl_gives_what_merge_takes(tiny_model_dir, tmp_path, data_params) -> None:
    train, val = gsm8k_prompts(16), gsm8k_prompts(4, "test", GSM8K_TEST)
    train.to_parquet(tmp_path / "train.parquet")
    val.to_parquet(tmp_path / "val.parquet")
    checkpoints = tmp_path / "models" / "train_checkpoints"
    catalog = DataCatalog(datasets={
        "train_prompts_file": MemoryDataset(str(tmp_path / "train.parquet")),
        "val_prompts_file": MemoryDataset(str(tmp_path / "val.parquet")),
        "train_prompts": MemoryDataset(train), "val_prompts": MemoryDataset(val),
        "base_model": MemoryDataset(str(tiny_model_dir)),
        "train_checkpoints_dir": MemoryDataset(str(checkpoints)),
    })
    catalog["params:train"] = {"engine": "trl", "trl": TRL}
    catalog["params:data"] = data_params
    catalog["params:reward"] = {"custom_reward_function": {"path": None,
                                                           "name": "compute_score"}}
    outputs = SequentialRunner().run(create_pipeline(), catalog)
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
