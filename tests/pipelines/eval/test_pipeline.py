"""The eval pipeline on an in-memory catalog with a tiny model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from rl_pipeline.config import DataParams, DataPrepParams, EvalParams, RewardParams
from rl_pipeline.data.prompts import to_verl_frame
from rl_pipeline.engines.train_params import TrainParams
from rl_pipeline.pipelines.eval import create_pipeline
from tests.conftest import read_gsm8k

EVAL = {"backend": "hf", "max_prompts": 3, "n_samples": 2, "greedy": False,
        "batch_size": 4, "rollout_val_temperature": 1.0}
REWARD = {"custom_reward_function": {"path": None, "name": "compute_score"}, "strict": False}


def _val_prompts() -> pd.DataFrame:
    records = read_gsm8k(n=5)
    work = pd.DataFrame({"question": [r["question"] for r in records],
                         "answer": [r["answer"] for r in records],
                         "ground_truth": [r["answer"].split("#### ")[-1] for r in records]})
    return to_verl_frame(work, DataPrepParams(), "val", "images")


def _run(base: Path, merged: Path | None, data_params: dict):
    catalog = DataCatalog(datasets={
        "val_prompts": MemoryDataset(_val_prompts()),
        "base_model": MemoryDataset(str(base)),
        "merged_model": MemoryDataset(str(merged) if merged else None),
    })
    # Kedro instantiates the typed groups in a session; a bare runner is handed them.
    catalog["params:eval"] = EvalParams.model_validate(EVAL)
    catalog["params:data"] = DataParams.model_validate(data_params)
    catalog["params:reward"] = RewardParams.model_validate(REWARD)
    catalog["params:train"] = TrainParams()
    return SequentialRunner().run(create_pipeline(), catalog)


def test_base_only_until_there_is_a_trained_model(tiny_model_dir, data_params) -> None:
    outputs = _run(tiny_model_dir, None, data_params)
    metrics = outputs["eval_metrics"].load()
    assert list(metrics) == ["base"]
    generations = outputs["eval_generations"].load()
    assert len(generations) == 3 * 2 and set(generations["model"]) == {"base"}
    assert "No trained model yet" in outputs["eval_report"].load()


def test_base_and_trained_side_by_side(tiny_model_dir, tmp_path, tokenizer, data_params) -> None:
    from rl_pipeline.testing import build_tiny_causal_lm

    trained = build_tiny_causal_lm(tmp_path / "trained", tokenizer, seed=1)
    outputs = _run(tiny_model_dir, trained, data_params)
    metrics = outputs["eval_metrics"].load()
    assert list(metrics) == ["base", "trained"]
    for label in metrics:
        for key in ("strict_accuracy", "flexible_accuracy", "mean_reward", "strict_pass_at_1",
                    "strict_pass_at_2", "mean_response_tokens", "truncation_rate",
                    "by_data_source", "reward_errors"):
            assert key in metrics[label]
    mlflow_metrics = outputs["eval_metrics_mlflow"].load()
    assert "base/strict_accuracy" in mlflow_metrics
    assert "trained/by_data_source/openai/gsm8k/mean_reward" in mlflow_metrics
    report = outputs["eval_report"].load()
    assert "| metric | base | trained | delta |" in report
    generations = outputs["eval_generations"].load()
    assert list(generations.groupby("model").size()) == [6, 6]
    assert {"prompt", "sample_index", "response", "reward", "strict", "flexible"} <= set(
        generations.columns)
