"""A versioned folder (a model, a checkpoint) as a catalog entry."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import DatasetError
from kedro.io.core import AbstractVersionedDataset, Version, VersionNotFoundError

from rl_pipeline.datasets.atomic import remove_if_empty, storage_error
from rl_pipeline.debris import staging_path


class ModelFolderDataset(AbstractVersionedDataset[str, "str | None"]):
    """A folder saved as a whole and loaded as its path.

    ``save`` takes the path of a finished folder and moves it into place (a copy when it is
    on another filesystem) under a hidden name, then renames it: a crash never leaves a
    folder that looks complete. ``load`` returns the path of the requested (by default the
    latest) version, or None when ``optional`` and nothing was saved yet.
    """

    def __init__(self, *, path: str, version: Version | None = None, optional: bool = False,
                 metadata: dict[str, Any] | None = None) -> None:
        super().__init__(filepath=PurePosixPath(path), version=version,
                         exists_function=lambda p: Path(p).is_dir())
        self._optional = optional
        self.metadata = metadata

    def load(self) -> str | None:
        try:
            path = Path(self._get_load_path())
        except VersionNotFoundError:
            if self._optional:
                return None
            raise
        if not path.is_dir():
            if self._optional and self._version is None:
                return None
            raise DatasetError(f"model folder not found: {path}")
        return str(path)

    def save(self, data: str) -> None:
        source = Path(data)
        if not source.is_dir():
            raise DatasetError(f"{type(self).__name__} saves a folder; {source} is not one")
        final = Path(self._get_save_path())
        staging = staging_path(final)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(source), str(staging))
            os.replace(staging, final)
        except OSError as exc:
            if (problem := storage_error(final, exc)) is None:
                raise
            raise problem from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
            remove_if_empty(final.parent)

    def _exists(self) -> bool:
        try:
            return Path(self._get_load_path()).is_dir()
        except DatasetError:
            return False

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._filepath), "version": self._version,
                "optional": self._optional}
