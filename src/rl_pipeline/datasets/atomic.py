"""kedro-datasets file datasets whose saves are atomic on the local filesystem.

The stock datasets open the final path and write into it, so a run killed mid-write
leaves a truncated file that the next run loads (for versioned datasets: as the latest
version). These subclasses let the parent write a hidden sibling file and rename it into
place, which is atomic on POSIX. A killed save leaves only the hidden ``.partial`` file,
which no load or version lookup matches. Remote filesystems keep the parent behaviour:
object stores publish an object only when its upload completes.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import DatasetError
from kedro_datasets.json import JSONDataset as _JSONDataset
from kedro_datasets.matplotlib import MatplotlibDataset as _MatplotlibDataset
from kedro_datasets.pandas import ParquetDataset as _ParquetDataset
from kedro_datasets.text import TextDataset as _TextDataset

from rl_pipeline.debris import staging_path


class AtomicSaveMixin:
    """Stage the parent's write in a hidden sibling file, then rename it into place."""

    _staging: PurePosixPath | None = None

    def save(self, data: Any) -> None:
        if getattr(self, "_protocol", "file") != "file":
            return _unwrapped_parent_save(type(self))(self, data)
        final = PurePosixPath(super()._get_save_path())  # type: ignore[misc]
        staging = PurePosixPath(staging_path(Path(final)))
        self._staging = staging
        try:
            Path(final).parent.mkdir(parents=True, exist_ok=True)
            _unwrapped_parent_save(type(self))(self, data)
            os.replace(staging, final)
        except OSError as exc:
            if (problem := storage_error(Path(final), exc)) is None:
                raise
            raise problem from exc
        finally:
            self._staging = None
            Path(staging).unlink(missing_ok=True)
            remove_if_empty(Path(final).parent)

    def _get_save_path(self) -> PurePosixPath:
        if self._staging is not None:
            return self._staging
        return super()._get_save_path()  # type: ignore[misc]


_ELSEWHERE = "or point this catalog entry elsewhere"
_NO_PERMISSION = f"no permission to write there: fix the folder's owner or mode, {_ELSEWHERE}"
_STORAGE_PROBLEMS = {
    errno.ENOSPC: f"the disk is full: free space on it, {_ELSEWHERE}",
    errno.EDQUOT: f"the disk quota is used up: free space, {_ELSEWHERE}",
    errno.EROFS: f"the file system is read-only: mount it writable, {_ELSEWHERE}",
    errno.EACCES: _NO_PERMISSION,
    errno.EPERM: _NO_PERMISSION,
    errno.EFBIG: "the file is larger than this process or file system allows",
}


def storage_error(path: Path, exc: OSError) -> DatasetError | None:
    """A save that failed for want of space or permission, said plainly; None for other
    errors."""
    # shutil.move across file systems gathers its copy errors into one shutil.Error whose
    # errno is None; the first "[Errno N]" in its text is the one that stopped the copy.
    code = exc.errno or int((re.search(r"\[Errno (\d+)\]", str(exc)) or [0, 0])[1])
    problem = _STORAGE_PROBLEMS.get(code)
    if problem is None:
        return None
    return DatasetError(f"cannot save {path}: {problem} ({os.strerror(code)}). Nothing was "
                        "replaced: earlier versions are intact.")


def remove_if_empty(folder: Path) -> None:
    """Drop the version folder a failed save made, if nothing else is in it."""
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty (the saved file, or another writer's), or not ours to remove


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
