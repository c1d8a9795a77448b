"""A catalog entry that loads the absolute path of a file or folder, for tools that read it.

verl reads its data files and writes its checkpoints itself, in a Ray actor that may run on
another node: it needs paths, not loaded data. ``PathDataset`` hands a node the path of the
latest version of a versioned dataset (``train_prompts``) or of a working folder
(``train_checkpoints``), declared in the catalog beside the entry that writes it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import DatasetError
from kedro.io.core import AbstractVersionedDataset, Version, VersionNotFoundError


class PathDataset(AbstractVersionedDataset[None, "str | None"]):
    """Loads the absolute path of ``path`` (its latest version when versioned). Read-only.

    Args:
        path: The file or folder.
        version: Kedro's version (set by the catalog when ``versioned: true``).
        must_exist: Fail on load when nothing is there (else the path is returned anyway,
            for a folder a tool will create).
        optional: Load None when nothing is there.
    """

    def __init__(self, *, path: str, version: Version | None = None, must_exist: bool = True,
                 optional: bool = False, metadata: dict[str, Any] | None = None) -> None:
        super().__init__(filepath=PurePosixPath(path), version=version,
                         exists_function=lambda p: Path(p).exists())
        self._must_exist = must_exist
        self._optional = optional
        self.metadata = metadata

    def load(self) -> str | None:
        try:
            path = Path(self._get_load_path())
        except VersionNotFoundError as exc:
            if self._optional:
                return None
            raise DatasetError(f"nothing saved yet at {self._filepath}: run the stage that "
                               "writes it first") from exc
        if not path.exists():
            if self._optional:
                return None
            if self._must_exist:
                raise DatasetError(f"not found: {path}")
        return str(path.absolute())

    def save(self, data: Any) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only: {self._filepath} is written "
                           "by the entry that owns it")

    def _exists(self) -> bool:
        try:
            return Path(self._get_load_path()).exists()
        except DatasetError:
            return False

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._filepath), "version": self._version,
                "must_exist": self._must_exist, "optional": self._optional}
