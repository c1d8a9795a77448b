"""Catalog entries that load the path of a file or folder, for tools that read it themselves.

verl reads its data files and writes its checkpoints itself, in a Ray actor that may run on
another node: it needs paths, not loaded data. ``PathDataset`` hands a node the path of the
latest version of a versioned dataset (``train_prompts``) or of a working folder
(``train_checkpoints``), declared in the catalog beside the entry that writes it.
:class:`~rl_pipeline.datasets.model_folder.ModelFolderDataset` shares the same base.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from kedro.io import DatasetError
from kedro.io.core import AbstractVersionedDataset, Version, VersionNotFoundError

_Saved = TypeVar("_Saved")


class LocalPathDataset(AbstractVersionedDataset[_Saved, "str | None"]):
    """Base of the entries that load as the path of a local file or folder (of its requested,
    by default latest, version).

    Subclasses say what counts as being there (:meth:`_present`), and what a load gives when
    nothing was saved (:meth:`_nothing_saved`) or the path is not there (:meth:`_missing`).
    """

    def __init__(self, *, path: str, version: Version | None, optional: bool,
                 metadata: dict[str, Any] | None) -> None:
        super().__init__(filepath=PurePosixPath(path), version=version,
                         exists_function=lambda p: self._present(Path(p)))
        self._optional = optional
        self.metadata = metadata

    @property
    def optional(self) -> bool:
        """Whether a load gives None when nothing is there (a stage may go without it)."""
        return self._optional

    def load(self) -> str | None:
        try:
            path = Path(self._get_load_path())
        except VersionNotFoundError as exc:
            if self._optional:
                return None
            if (problem := self._nothing_saved()) is None:
                raise
            raise problem from exc
        return self._loaded(path) if self._present(path) else self._missing(path)

    @staticmethod
    def _present(path: Path) -> bool:
        return path.exists()

    def _nothing_saved(self) -> DatasetError | None:
        """The error for a versioned entry without versions; None: Kedro's own."""
        return None

    def _loaded(self, path: Path) -> str:
        return str(path)

    def _missing(self, path: Path) -> str | None:
        if self._optional:
            return None
        raise DatasetError(f"not found: {path}")

    def _exists(self) -> bool:
        try:
            return self._present(Path(self._get_load_path()))
        except DatasetError:
            return False

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._filepath), "version": self._version,
                "optional": self._optional}


class PathDataset(LocalPathDataset[None]):
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
        super().__init__(path=path, version=version, optional=optional, metadata=metadata)
        self._must_exist = must_exist

    def save(self, data: Any) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only: {self._filepath} is written "
                           "by the entry that owns it")

    def _nothing_saved(self) -> DatasetError:
        return DatasetError(f"nothing saved yet at {self._filepath}: run the stage that "
                            "writes it first")

    def _loaded(self, path: Path) -> str:
        return str(path.absolute())

    def _missing(self, path: Path) -> str | None:
        if self._optional or self._must_exist:
            return super()._missing(path)
        return self._loaded(path)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "must_exist": self._must_exist}


class CheckpointRootDataset(PathDataset):
    """``train_checkpoints``: the folder of one folder per training run identity. Loads a
    :class:`~rl_pipeline.engines.run_identity.CheckpointRoot`: its absolute path and how many
    identities' checkpoints the train stage keeps (the most recently used; older ones are
    deleted after a successful run).

    Args:
        path: The folder (created by the first training run).
        keep_identities: Identities to keep, the current one included.
    """

    def __init__(self, *, path: str, keep_identities: int = 3,
                 metadata: dict[str, Any] | None = None) -> None:
        if keep_identities < 1:
            raise DatasetError(f"keep_identities={keep_identities}: at least 1 (the run that "
                               "just trained)")
        super().__init__(path=path, must_exist=False, metadata=metadata)
        self._keep = keep_identities

    def load(self) -> Any:
        from rl_pipeline.engines.run_identity import CheckpointRoot

        return CheckpointRoot(str(super().load()), keep_identities=self._keep)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "keep_identities": self._keep}
