"""kedro-datasets file datasets whose saves are atomic on the local filesystem.

The stock datasets open the final path and write into it, so a run killed mid-write
leaves a truncated file that the next run loads (for versioned datasets: as the latest
version). These subclasses let the parent write a hidden sibling file and rename it into
place, which is atomic on POSIX. A killed save leaves only the hidden ``.partial`` file,
which no load or version lookup matches. Remote filesystems keep the parent behaviour:
object stores publish an object only when its upload completes.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import DatasetError
from kedro.io.core import AbstractVersionedDataset, Version
from kedro_datasets.json import JSONDataset as _JSONDataset
from kedro_datasets.matplotlib import MatplotlibDataset as _MatplotlibDataset
from kedro_datasets.pandas import ParquetDataset as _ParquetDataset
from kedro_datasets.text import TextDataset as _TextDataset

from rl_pipeline.runs.staging import staged


class AtomicSaveMixin:
    """Stage the parent's write in a hidden sibling file, then rename it into place."""

    _staging: PurePosixPath | None = None

    def save(self, data: Any) -> None:
        if getattr(self, "_protocol", "file") != "file":
            _unwrapped_parent_save(type(self))(self, data)
        else:
            final = Path(super()._get_save_path())  # type: ignore[misc]
            try:
                with staged(final, error=DatasetError) as staging:
                    self._staging = PurePosixPath(staging)
                    _unwrapped_parent_save(type(self))(self, data)
            finally:
                self._staging = None
        load_what_was_saved(self)  # type: ignore[arg-type]

    def _get_save_path(self) -> PurePosixPath:
        if self._staging is not None:
            return self._staging
        return super()._get_save_path()  # type: ignore[misc]


def load_what_was_saved(dataset: AbstractVersionedDataset) -> None:
    """From now on, load the version this dataset object just saved, not the newest one.

    Kedro loads a versioned entry's newest version, and a node later in the same session
    that reads back what an earlier one saved (merge's publish reads the merged model) gets
    another run's version when a run started beside this one saved a newer one meanwhile
    (runs by hand may overlap: rl_pipeline.runs.stage_lock), and would then register that
    run's model as this one's. Kedro warns when the two differ; this makes them agree. A
    load version set in the catalog or by ``--load-versions`` is kept.
    """
    version = getattr(dataset, "_version", None)
    if version is None or (version.load is not None
                           and not getattr(dataset, "_loads_its_save", False)):
        return
    dataset._version = Version(dataset.resolve_save_version(), version.save)
    dataset._loads_its_save = True  # type: ignore[attr-defined]  # a later save moves it on


def _unwrapped_parent_save(cls: type) -> Any:
    # Kedro wraps every dataset's save with versioning and error handling. Our own save is
    # wrapped too, so call the parent's inner function to run that wrapper once, after the
    # rename, when the saved version is really there.
    mro = cls.__mro__
    parent = next(c for c in mro[mro.index(AtomicSaveMixin) + 1:] if "save" in c.__dict__)
    return getattr(parent.save, "__wrapped__", parent.save)


class ParquetDataset(AtomicSaveMixin, _ParquetDataset):
    """``pandas.ParquetDataset`` with atomic local saves."""


class JSONDataset(AtomicSaveMixin, _JSONDataset):
    """``json.JSONDataset`` with atomic local saves."""


class MatplotlibDataset(AtomicSaveMixin, _MatplotlibDataset):
    """``matplotlib.MatplotlibDataset`` with atomic local saves (single figures)."""


class TextDataset(AtomicSaveMixin, _TextDataset):
    """``text.TextDataset`` with atomic local saves."""
