"""The data_prep pipeline run by Kedro's runner over an in-memory catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from rl_pipeline.config import DataParams, DataPrepParams
from rl_pipeline.data.prompts import DataError
from rl_pipeline.data.records import read_jsonl
from rl_pipeline.pipelines.data_prep import create_pipeline
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
