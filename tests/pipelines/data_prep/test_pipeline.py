"""The data_prep pipeline run by Kedro's runner over an in-memory catalog."""

from __future__ import annotations

from pathlib import Path

from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from rl_pipeline.config import DataParams, DataPrepParams
from rl_pipeline.data.records import read_jsonl
from rl_pipeline.pipelines.data_prep import create_pipeline
from tests.conftest import read_gsm8k, write_jsonl


def test_pipeline_runs_on_an_in_memory_catalog(tmp_path: Path, tokenizer_dir, prep_params,
                                               data_params) -> None:
    records = read_gsm8k(n=40)
    catalog = DataCatalog(datasets={
        "raw_train": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "t.jsonl", records[:30]))),
        "raw_val": MemoryDataset(read_jsonl(write_jsonl(tmp_path / "v.jsonl", records[30:]))),
        "base_model": MemoryDataset(str(tokenizer_dir)),
    })
    # Kedro instantiates the typed groups in a session; a bare runner is handed them.
    catalog["params:data_prep"] = DataPrepParams.model_validate(prep_params)
    catalog["params:data"] = DataParams.model_validate(data_params)
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
