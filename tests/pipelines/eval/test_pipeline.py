"""The eval pipeline on an in-memory catalog with a tiny model."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
import pytest
from kedro.io import AbstractDataset, DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from rl_pipeline.data.prompts import to_verl_frame
from rl_pipeline.datasets.mlflow_table import MlflowTableDataset
from rl_pipeline.params import (
    DataParams,
    DataPrepParams,
    EvalParams,
    PromoteParams,
    RegistryParams,
    RewardParams,
    resolve_followers,
)
from rl_pipeline.pipelines.eval import create_pipeline
from rl_pipeline.trained_questions import write_trained_questions
from tests.catalogs import KeptDataset
from tests.conftest import read_gsm8k

# Slow: the eval pipeline runs whole (generation) in a Kedro runner.
pytestmark = pytest.mark.slow

EVAL = {"backend": "hf", "max_prompts": 3, "n_samples": 2, "greedy": False,
        "batch_size": 4, "rollout_val_temperature": 1.0, "pass_k": [1, 2, 4],
        "bootstrap_resamples": 1000}
REWARD = {"custom_reward_function": {"path": None, "name": "compute_score"}, "strict": False}
TABLE = "eval/eval_generations.json"


def _val_prompts() -> pd.DataFrame:
    records = read_gsm8k(n=5)
    work = pd.DataFrame({"question": [r["question"] for r in records],
                         "answer": [r["answer"] for r in records],
                         "ground_truth": [r["answer"].split("#### ")[-1] for r in records]})
    return to_verl_frame(work, DataPrepParams(), "val", "images")


def _run(base: Path, merged: Path | None, data_params: dict,
         table: AbstractDataset | None = None):
    catalog = DataCatalog(datasets={
        "val_prompts": MemoryDataset(_val_prompts()),
        "base_model": MemoryDataset(str(base)),
        "merged_model": MemoryDataset(str(merged) if merged else None),
        "eval_generations_table": table or MemoryDataset(),
        "eval_metrics": KeptDataset(),  # record_eval reads it too: kept for the test
        "eval_registry": KeptDataset(),  # and eval_run_tags this
    })
    # Kedro instantiates the typed groups in a session; a bare runner is handed them.
    # ... with their followers resolved, as WholeConfigurationHook hands them.
    groups = resolve_followers({"eval": EvalParams.model_validate(EVAL),
                                "data": DataParams.model_validate(data_params),
                                "reward": RewardParams.model_validate(REWARD)})
    for name, group in groups.items():
        catalog[f"params:{name}"] = group
    catalog["params:train.ray_address"] = None  # no cluster
    catalog["params:registry"] = RegistryParams(model_name=None)  # eval alone, no registry
    catalog["params:promote"] = PromoteParams()
    outputs = SequentialRunner().run(create_pipeline(), catalog)
    outputs["eval_metrics"] = catalog["eval_metrics"]
    assert catalog["eval_registry"].load() == {"recorded": False}  # no registry here
    return outputs, catalog


def test_base_only_until_there_is_a_trained_model(tiny_model_dir, data_params) -> None:
    outputs, catalog = _run(tiny_model_dir, None, data_params)
    metrics = outputs["eval_metrics"].load()
    assert list(metrics) == ["base"]
    generations = outputs["eval_generations"].load()
    assert len(generations) == 3 * 2 and set(generations["model"]) == {"base"}
    report = outputs["eval_report"].load()
    assert "No trained model yet" in report and "| metric | base |" in report
    assert "Is the difference real?" not in report
    table = catalog.load("eval_generations_table")
    assert "base_response" in table and "trained_response" not in table
    assert isinstance(outputs["eval_chart"].load(), Figure)


@pytest.fixture
def trained_model(tmp_path, tokenizer) -> Path:
    from rl_pipeline.testing import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path / "trained", tokenizer, seed=1)


def test_base_and_trained_side_by_side(tiny_model_dir, trained_model, data_params) -> None:
    # It was trained on the first validation question (a data_prep rerun since made a new
    # split): eval compares the two models on the next three, which it has not seen.
    write_trained_questions(trained_model, _val_prompts().head(1))
    outputs, _ = _run(tiny_model_dir, trained_model, data_params)
    asked = " ".join(outputs["eval_generations"].load()["prompt"])
    questions = [extra["question"] for extra in _val_prompts()["extra_info"]]
    assert [q in asked for q in questions] == [False, True, True, True, False]
    metrics = outputs["eval_metrics"].load()
    assert list(metrics) == ["base", "trained"]
    tags = outputs["eval_run_tags"].load()  # the models compared, for a reviewer
    assert tags["eval.base_model"] == str(tiny_model_dir) and "eval.champion_version" not in tags
    # 3 of the 4 prompts it could use (eval.max_prompts); no registry, so no version.
    assert tags["eval.quick_check"] == "true" and "eval.candidate_version" not in tags
    for label in metrics:
        for key in ("strict_accuracy", "flexible_accuracy", "mean_reward", "strict_pass_at_1",
                    "strict_pass_at_2", "pass_at_1", "pass_at_2", "maj_at_2", "mean_at_2",
                    "mean_response_tokens", "truncation_rate", "by_data_source",
                    "reward_errors"):
            assert key in metrics[label]
        assert "pass_at_4" not in metrics[label]  # 2 samples per prompt
    compared = metrics["trained"]["vs_base"]
    assert set(compared) >= {"mean_reward", "pass_at_1", "maj_at_2", "strict_accuracy",
                             "flexible_pass_at_2"}
    for c in compared.values():
        assert c["ci_low"] <= c["delta"] <= c["ci_high"] and c["prompts"] == 3
    assert "vs_base" in metrics["trained"]["by_data_source"]["openai/gsm8k"]
    mlflow_metrics = outputs["eval_metrics_mlflow"].load()
    assert "base/strict_accuracy" in mlflow_metrics
    assert "trained/by_data_source/openai/gsm8k/mean_reward" in mlflow_metrics
    assert "trained/vs_base/mean_reward/ci_low" in mlflow_metrics
    assert "trained/vs_base/mean_reward/sd_diff" not in mlflow_metrics  # kept in the JSON
    report = outputs["eval_report"].load()
    assert ("3 (openai/gsm8k 3) of the 5 validation prompts; 1 left out because the trained "
            "model was trained on them; eval.max_prompts cut the rest") in report
    assert "| metric | base | trained | delta |" in report
    for text in ("## Is the difference real?", "## Headline by data source",
                 "skipped k = 4: more than the 2 samples per prompt",
                 "sampled (temperature 1.0, top_p 0.7, top_k off), n = 2 samples per prompt",
                 "the reward `compute_score`", "distinguishable from noise",
                 "read it as a rough indication"):  # 3 prompts: too few to trust
        assert text in report
    generations = outputs["eval_generations"].load()
    assert list(generations.groupby("model").size()) == [6, 6]
    assert {"prompt", "sample_index", "response", "reward", "strict", "flexible",
            "answer"} <= set(generations.columns)
    # strict and flexible against verl's own scorer are tested on responses that answer, right
    # and wrong (tests/evaluation/test_gsm8k.py): the tiny random models here never write
    # "####", so a comparison on their generations would hold whatever the scorers did.


@pytest.fixture
def sqlite_tracking(tmp_path, monkeypatch) -> str:
    """MLflow tracking to a SQLite store in tmp_path, for this test only."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # restored after the test
    mlflow.set_tracking_uri(uri)
    # Its own experiment: MLflow keeps the active experiment's id across stores, and another
    # test's (id 1 of its store) is no experiment of this one.
    mlflow.set_experiment("eval-tests")
    yield uri
    mlflow.set_tracking_uri(None)  # back to the environment's


def test_generations_table_is_logged_to_mlflow(tiny_model_dir, trained_model, data_params,
                                               sqlite_tracking) -> None:
    with mlflow.start_run() as run:
        _run(tiny_model_dir, trained_model, data_params, MlflowTableDataset(TABLE))
    table = mlflow.load_table(TABLE, run_ids=[run.info.run_id])
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "eval")}
    assert TABLE in artifacts
    assert len(table) == 3 * 2  # one row per prompt and sample
    assert {"prompt", "ground_truth", "data_source", "base_response", "base_reward",
            "base_strict", "base_flexible", "trained_response", "trained_reward",
            "trained_strict", "trained_flexible"} <= set(table.columns)
    assert list(zip(table["prompt_index"], table["sample_index"], strict=True)) == [
        (p, s) for p in range(3) for s in range(2)]
    assert set(table["data_source"]) == {"openai/gsm8k"}


def test_table_dataset_without_an_mlflow_run_logs_nothing(sqlite_tracking) -> None:
    assert mlflow.active_run() is None
    MlflowTableDataset(TABLE).save(pd.DataFrame({"a": [1]}))
    assert mlflow.search_runs(search_all_experiments=True).empty  # no run was started
