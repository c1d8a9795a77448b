"""Raw inputs: JSONL files and Hugging Face datasets (saved folders, data-file folders)."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
from kedro.io import DatasetError

from rl_pipeline.datasets.raw_records import RawRecordsDataset
from tests.conftest import write_jsonl


def test_jsonl_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"q": "x"}])
    raw = RawRecordsDataset(filepath=str(path)).load()
    assert raw.records == [{"q": "x"}] and raw.origin == f"{path}, line"


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="input file not found: .*nope.jsonl"):
        RawRecordsDataset(filepath=str(tmp_path / "nope.jsonl")).load()


def test_a_folder_or_a_table_file_as_the_input_file_says_to_use_dataset_name(
        tmp_path: Path) -> None:
    """Read as JSON Lines, a Parquet file failed at every 'line' with advice to fix them."""
    table = datasets.Dataset.from_dict({"question": ["a"], "answer": ["1"]})
    table.to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(DatasetError) as err:
        RawRecordsDataset(filepath=str(tmp_path / "train.parquet")).load()
    assert str(err.value) == (
        f"{tmp_path / 'train.parquet'} is a .parquet file; the input file takes JSON Lines "
        "(one JSON object per line): for a folder of data files (Parquet, CSV, JSON), or a "
        "save_to_disk folder, set dataset_name to the folder")
    with pytest.raises(DatasetError, match=f"^{tmp_path} is a folder; the input file takes"):
        RawRecordsDataset(filepath=str(tmp_path)).load()
    # ... and the folder, as dataset_name, reads it.
    assert RawRecordsDataset(dataset_name=str(tmp_path)).load().records == [
        {"question": "a", "answer": "1"}]


def test_a_file_as_dataset_name_says_to_use_dataset_train_split(tmp_path: Path) -> None:
    """datasets' own error sent the user to "a local copy" of what was one already."""
    path = write_jsonl(tmp_path / "good.jsonl", [{"q": "x"}])
    with pytest.raises(DatasetError) as err:
        RawRecordsDataset(dataset_name=str(path)).load()
    assert str(err.value) == (
        f"dataset_name={str(path)!r} is a file; dataset_name takes a Hugging Face dataset or "
        "a folder of one. For a JSON Lines file, set dataset_train_split (and "
        "dataset_validation_split) instead")


def test_optional_empty_source_loads_as_none() -> None:
    assert RawRecordsDataset(filepath="", optional=True).load() is None
    with pytest.raises(DatasetError, match="no input given"):
        RawRecordsDataset(filepath="").load()


def test_hf_dataset_saved_to_disk_with_split_fallback(tmp_path: Path) -> None:
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"problem": ["a", "b"], "answer": ["1", "2"]}),
        "test": datasets.Dataset.from_dict({"problem": ["c"], "answer": ["3"]}),
    })
    dd.save_to_disk(str(tmp_path / "ds"))
    train = RawRecordsDataset(dataset_name=str(tmp_path / "ds"), split="train").load()
    val = RawRecordsDataset(dataset_name=str(tmp_path / "ds"), split=["validation", "test"],
                            optional=True).load()
    assert [r["problem"] for r in train.records] == ["a", "b"]
    assert val.records == [{"problem": "c", "answer": "3"}] and val.unit == "row"
    assert "[test]" in val.source
    assert RawRecordsDataset(dataset_name=str(tmp_path / "ds"), split="validation",
                             optional=True).load() is None
    with pytest.raises(DatasetError, match="has no split validation; splits found: train, test"):
        RawRecordsDataset(dataset_name=str(tmp_path / "ds"), split="validation").load()


def test_hf_folder_of_data_files(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"problem": "p", "answer": "1"}])
    raw = RawRecordsDataset(dataset_name=str(folder), split="train").load()
    assert raw.records == [{"problem": "p", "answer": "1"}]


def test_hf_images_stay_undecoded_bytes(tmp_path: Path) -> None:
    from PIL import Image

    png = tmp_path / "dot.png"
    Image.new("RGB", (2, 2), "red").save(png)
    features = datasets.Features({"problem": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image())})
    ds = datasets.Dataset.from_dict({"problem": ["<image>color?"], "images": [[str(png)]]},
                                    features=features)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "mm"))
    raw = RawRecordsDataset(dataset_name=str(tmp_path / "mm")).load()
    image = raw.records[0]["images"][0]
    assert set(image) == {"bytes", "path"} and image["bytes"].startswith(b"\x89PNG")


def test_unreachable_hub_id_names_it_and_what_to_do(monkeypatch) -> None:
    from huggingface_hub import constants

    # Both libraries read their offline switch at import; set the live values.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(DatasetError, match="'nobody/no-such-dataset'.*Offline, point"):
        RawRecordsDataset(dataset_name="nobody/no-such-dataset").load()
