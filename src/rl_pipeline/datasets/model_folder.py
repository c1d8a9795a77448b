"""A versioned folder (a model, a checkpoint) as a catalog entry."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kedro.io import DatasetError
from kedro.io.core import Version

from rl_pipeline.datasets.atomic import load_what_was_saved
from rl_pipeline.datasets.paths import LocalPathDataset
from rl_pipeline.runs.staging import staged


class ModelFolderDataset(LocalPathDataset[str]):
    """A folder saved as a whole and loaded as its path.

    ``save`` takes the path of a finished folder and moves it into place (a copy when it is
    on another filesystem) under a hidden name, then renames it: a crash never leaves a
    folder that looks complete. ``load`` returns the path of the requested (by default the
    latest) version, or None when ``optional`` and nothing was saved yet; after a save, the
    folder that save put in place.
    """

    def __init__(self, *, path: str, version: Version | None = None, optional: bool = False,
                 metadata: dict[str, Any] | None = None) -> None:
        super().__init__(path=path, version=version, optional=optional, metadata=metadata)

    def save(self, data: str) -> None:
        source = Path(data)
        if not source.is_dir():
            raise DatasetError(f"{type(self).__name__} saves a folder; {source} is not one")
        with staged(Path(self._get_save_path()), error=DatasetError) as staging:
            shutil.move(str(source), str(staging))
        load_what_was_saved(self)

    @staticmethod
    def _present(path: Path) -> bool:
        return path.is_dir()

    def _missing(self, path: Path) -> str | None:
        if self._optional and self._version is None:
            return None
        raise DatasetError(f"model folder not found: {path}")
