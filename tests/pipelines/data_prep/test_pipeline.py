"""The data_prep pipeline run by Kedro's runner over an in-memory catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from rl_pipeline.data.prompts import DataError
from rl_pipeline.data.records import read_jsonl
from rl_pipeline.params import DataParams, DataPrepParams, RewardParams
from rl_pipeline.pipelines.data_prep import create_pipeline
from rl_pipeline.rewards.self_test import RewardSelfTestError
from tests.conftest import read_gsm8k, write_jsonl


def _catalog(tmp_path: Path, tokenizer_dir: Path, prep_params: dict,
             data_params: dict) -> DataCatalog:
    """30 GSM8K train and 10 val records, the tiny tokenizer as the base model."""
    records = read_gsm8k(n=40)
    catalog = DataCatalog(datasets={
        "raw_train": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "t.jsonl", records[:30]))),
        "raw_val": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "v.jsonl", records[30:]))),
        "base_model": MemoryDataset(str(tokenizer_dir)),
    })
    # Kedro instantiates the typed groups in a session; a bare runner is handed them.
    catalog["params:data_prep"] = DataPrepParams.model_validate(prep_params)
    catalog["params:data"] = DataParams.model_validate(data_params)
    catalog["params:reward"] = RewardParams()
    return catalog


def test_pipeline_runs_on_an_in_memory_catalog(tmp_path: Path, tokenizer_dir, prep_params,
                                               data_params) -> None:
    catalog = _catalog(tmp_path, tokenizer_dir, prep_params, data_params)
    outputs = SequentialRunner().run(create_pipeline(), catalog)
    assert len(outputs["train_prompts"].load()) == 30
    assert len(outputs["val_prompts"].load()) == 10
    report = outputs["data_prep_report"].load()
    assert report["rows_out"] == {"train": 30, "val": 10, "total": 40}


def test_pipeline_slice_up_to_cleaning_needs_no_tokenizer(tmp_path: Path, prep_params,
                                                          data_params) -> None:
    records = read_gsm8k(n=12)
    catalog = DataCatalog(datasets={
        "raw_train": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "t.jsonl", records))),
        "raw_val": MemoryDataset(None),
    })
    catalog["params:data_prep"] = DataPrepParams.model_validate({**prep_params,
                                                                 "val_fraction": 0.25})
    catalog["params:data"] = DataParams.model_validate(data_params)
    pipeline = create_pipeline().to_nodes("clean_prompt_splits_node")
    outputs = SequentialRunner().run(pipeline, catalog)
    assert (len(outputs["train_work"].load()), len(outputs["val_work"].load())) == (9, 3)


def test_a_split_left_empty_fails_the_run_and_publishes_no_prompts(tmp_path: Path, tokenizer_dir,
                                                                  prep_params,
                                                                  data_params) -> None:
    catalog = _catalog(tmp_path, tokenizer_dir, prep_params,
                       {**data_params, "data_max_prompt_length": 5})
    with pytest.raises(DataError, match="no train prompts left: 30 train row"):
        SequentialRunner().run(create_pipeline(), catalog)
    assert catalog.exists("train_work")  # cleaning ran; the length filter then failed
    for name in ("train_prompts", "val_prompts", "data_prep_report"):
        assert not catalog.exists(name), f"{name} was saved"


# MATH-style records: LaTeX answers that GSM8K's '#### <number>' scorer cannot read.
MATH_RECORDS = [{"problem": f"Problem {i}: simplify.", "answer": a}
                for i, a in enumerate([r"\frac{1}{2}", r"2\sqrt{2}", r"\pi", "(3, -1)",
                                       r"\frac{7}{9}", "x^2+1", r"\frac{3}{4}", r"\sqrt{5}"] * 2)]


def _math_catalog(tmp_path: Path, tokenizer_dir: Path, data_source: str) -> DataCatalog:
    catalog = DataCatalog(datasets={
        "raw_train": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "t.jsonl",
                                                          MATH_RECORDS[:12]))),
        "raw_val": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "v.jsonl",
                                                        MATH_RECORDS[12:]))),
        "base_model": MemoryDataset(str(tokenizer_dir)),
    })
    catalog["params:data_prep"] = DataPrepParams(
        dataset_prompt_column="problem", answer_column="answer", data_source=data_source,
        drop_duplicates=False, drop_train_val_overlap=False)
    catalog["params:data"] = DataParams()
    catalog["params:reward"] = RewardParams()
    return catalog


def test_math_answers_under_the_default_gsm8k_source_are_refused_before_publishing(
        tmp_path: Path, tokenizer_dir) -> None:
    catalog = _math_catalog(tmp_path, tokenizer_dir, "openai/gsm8k")
    with pytest.raises(RewardSelfTestError) as failed:
        SequentialRunner().run(create_pipeline(), catalog)
    message = str(failed.value)
    assert "reward self-test failed for data_source 'openai/gsm8k'" in message
    assert "data_prep.data_source" in message and "0% of 16 rows" in message
    for name in ("train_prompts", "val_prompts", "data_prep_report"):
        assert not catalog.exists(name), f"{name} was saved"


def test_math_answers_under_a_math_source_pass_and_are_reported(tmp_path: Path,
                                                                tokenizer_dir) -> None:
    catalog = _math_catalog(tmp_path, tokenizer_dir, "HuggingFaceH4/MATH-500")
    outputs = SequentialRunner().run(create_pipeline(), catalog)
    report = outputs["data_prep_report"].load()["reward_self_test"]["HuggingFaceH4/MATH-500"]
    assert report["passed"] and report["gold_correct"] == 1.0 and report["rows"] == 16
    assert "math-verify" in report["scorer"]
    metrics = outputs["data_prep_metrics"].load()
    assert metrics["reward_self_test.HuggingFaceH4/MATH-500.gold_correct"]["value"] == 1.0
