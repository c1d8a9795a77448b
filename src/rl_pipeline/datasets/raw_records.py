"""Raw training data as a Kedro dataset: a JSONL file or a Hugging Face dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from rl_pipeline.data.records import RawRecords, read_jsonl

# Files that Hugging Face datasets reads from a folder, which are not JSON Lines.
TABLE_SUFFIXES = (".parquet", ".csv", ".tsv", ".arrow", ".feather", ".xlsx")


class RawRecordsDataset(AbstractDataset[None, "RawRecords | None"]):
    """Read-only source of raw records, with their line or row numbers.

    Exactly one source is used: ``dataset_name`` (the GRPO spec's Hugging Face dataset: a
    ``save_to_disk`` folder, a folder of data files, or a hub id, fetched when online) with
    the first of ``split`` that exists; else ``filepath``, a JSON Lines file. With
    ``optional: true`` an empty source loads as ``None`` (for the validation input: data_prep
    then splits validation off train).

    Example::

        raw_val:
          type: rl_pipeline.datasets.raw_records.RawRecordsDataset
          filepath: data/01_raw/gsm8k/test.jsonl
          dataset_name: ""
          split: [validation, test]
          optional: true
    """

    def __init__(self, *, filepath: str | None = None, dataset_name: str | None = None,
                 split: str | list[str] = "train", optional: bool = False,
                 metadata: dict[str, Any] | None = None) -> None:
        self._filepath = filepath or None
        self._dataset_name = dataset_name or None
        self._splits = [split] if isinstance(split, str) else list(split)
        self._optional = optional
        self.metadata = metadata

    def load(self) -> RawRecords | None:
        if self._dataset_name:
            return self._load_hf()
        if not self._filepath:
            if self._optional:
                return None
            raise DatasetError("no input given: set a JSONL file (filepath, or the parameter "
                               "dataset_train_split) or a Hugging Face dataset (dataset_name)")
        path = Path(self._filepath)
        folder_instead = ("for a folder of data files (Parquet, CSV, JSON), or a save_to_disk "
                          "folder, set dataset_name to the folder")
        if path.is_dir():
            raise DatasetError(f"{path} is a folder; the input file takes a JSON Lines file "
                               f"(one JSON object per line): {folder_instead}")
        if not path.is_file():
            raise DatasetError(f"input file not found: {path} (expected a JSON Lines file)")
        if path.suffix.lower() in TABLE_SUFFIXES:
            # Read as JSON Lines, such a file fails at every line with advice that cannot help.
            raise DatasetError(f"{path} is a {path.suffix} file; the input file takes JSON "
                               f"Lines (one JSON object per line): {folder_instead}")
        return read_jsonl(path)

    def save(self, data: Any) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only")

    def _exists(self) -> bool:
        # No stage writes raw records, so a run's check of its inputs has nothing to say
        # about them (Kedro's default warns instead); load names what is wrong.
        return True

    def _describe(self) -> dict[str, Any]:
        return {"filepath": self._filepath, "dataset_name": self._dataset_name,
                "split": self._splits, "optional": self._optional}

    def _load_hf(self) -> RawRecords | None:
        import datasets  # heavy; only when a Hugging Face dataset is asked for

        name = self._dataset_name
        if Path(name).is_file():  # datasets' own error would send one to a local copy
            raise DatasetError(f"dataset_name={name!r} is a file; dataset_name takes a Hugging "
                               "Face dataset or a folder of one. For a JSON Lines file, set "
                               "dataset_train_split (and dataset_validation_split) instead")
        try:
            local = Path(name)
            if local.is_dir() and any((local / f).exists() for f in
                                      ("dataset_dict.json", "state.json")):
                loaded = datasets.load_from_disk(str(local))
            else:
                loaded = datasets.load_dataset(name)
        except Exception as exc:  # the library raises many types for "not there"
            raise DatasetError(
                f"could not load the Hugging Face dataset {name!r}: {exc}. Offline, point "
                "dataset_name at a local copy (a save_to_disk folder or a folder of data files)."
            ) from exc
        if isinstance(loaded, datasets.Dataset):
            loaded = datasets.DatasetDict({self._splits[0]: loaded})
        split = next((s for s in self._splits if s in loaded), None)
        if split is None:
            if self._optional:
                return None
            raise DatasetError(f"Hugging Face dataset {name!r} has no split "
                               f"{' or '.join(self._splits)}; splits found: {', '.join(loaded)}")
        table = loaded[split]
        # Keep images as {bytes, path} dicts (what verl's multimodal datasets read and what
        # parquet stores), not decoded PIL objects.
        for column, feature in table.features.items():
            if _is_image_feature(feature):
                table = table.cast_column(column, _undecoded(feature))
        records = table.to_list()
        return RawRecords(source=f"{name} [{split}]", records=records,
                          lines=list(range(1, len(records) + 1)), unit="row")


def _is_image_feature(feature: Any) -> bool:
    import datasets

    if isinstance(feature, datasets.Image):
        return True
    inner = getattr(feature, "feature", None)
    return isinstance(feature, list | datasets.Sequence | datasets.List) and (
        _is_image_feature(feature[0] if isinstance(feature, list) else inner))


def _undecoded(feature: Any) -> Any:
    import datasets

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(feature, list):
        return [_undecoded(feature[0])]
    return datasets.List(_undecoded(feature.feature))
