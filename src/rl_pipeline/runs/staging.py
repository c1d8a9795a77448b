"""Writes that appear whole or not at all: stage under a hidden name, then rename into place.

A file or folder is written to a hidden sibling (named by :func:`.debris.staging_path`,
so the next run removes it if this one is killed) and renamed to its final name when complete,
which is atomic on POSIX. No load or version lookup ever matches the hidden name. Its data
reaches the disk before the rename, and the rename before the block ends (``fsync``), so a
machine that loses power just after does not come back with a new version under its final
name that is empty or cut short.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rl_pipeline.errors import UserError
from rl_pipeline.runs.debris import remove, staging_path


class StorageError(UserError, OSError):
    """A write failed for want of space or permission; the message says which and what to do."""


@contextmanager
def staged(final: str | Path,
           error: Callable[[str], Exception] = StorageError) -> Iterator[Path]:
    """Write ``final`` whole or not at all.

    The block writes the yielded path (a hidden sibling of ``final``, not yet there) as a
    file or a folder; when the block ends without error it is renamed to ``final``, replacing
    what was there. On any failure it is removed, and so is the folder this made for
    ``final`` if nothing else is in it.

    Args:
        final: Where the file or folder belongs.
        error: Raised, with a message saying what to do, when the write fails for want of
            space or permission (say, ``kedro.io.DatasetError`` for a dataset's save).
            Other errors propagate unchanged.
    """
    final = Path(final)
    staging = staging_path(final)
    made_folder = not final.parent.exists()
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        yield staging
        _flush(staging)
        _rename_into_place(staging, final)
        _flush(final.parent)
    except OSError as exc:
        if (problem := storage_problem(final, exc)) is None:
            raise
        raise error(problem) from exc
    finally:
        remove(staging)
        if made_folder:
            _remove_if_empty(final.parent)


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


def storage_problem(path: Path, exc: OSError) -> str | None:
    """What a write of ``path`` that failed for want of space or permission means and what to
    do, said plainly; None for other errors (and for a source the write was reading)."""
    if exc.filename is not None and not _on_the_way_to(Path(os.fsdecode(exc.filename)), path):
        return None
    # shutil.move across file systems gathers its copy errors into one shutil.Error whose
    # errno is None; the first "[Errno N]" in its text is the one that stopped the copy.
    code = exc.errno or int((re.search(r"\[Errno (\d+)\]", str(exc)) or [0, 0])[1])
    problem = _STORAGE_PROBLEMS.get(code)
    if problem is None:
        return None
    return (f"cannot save {path}: {problem} ({os.strerror(code)}). Nothing was replaced: "
            "earlier versions are intact.")


def _on_the_way_to(failed: Path, final: Path) -> bool:
    # The write's own folders and files: final's folder, its parents, and what is inside it.
    failed, folder = failed.absolute(), final.parent.absolute()
    return failed == folder or failed in folder.parents or folder in failed.parents


def _rename_into_place(staging: Path, final: Path) -> None:
    if not staging.is_dir() or not (final.exists() or final.is_symlink()):
        os.replace(staging, final)
        return
    # A folder cannot be renamed over a non-empty one: move the old one aside first, under a
    # name that the next run sweeps should this one be killed in between.
    old = staging_path(final)
    os.replace(final, old)
    os.replace(staging, final)
    remove(old)


def _flush(path: Path) -> None:
    # A rename is atomic for processes but, after a power loss, can reach the disk before
    # the file's data: every Kedro version is a new name, so ext4's flush on replace does
    # not apply. A folder's files are flushed, then the folder itself (its entries).
    if path.is_symlink():
        return  # what it points at is not this write's
    if path.is_dir():
        for child in path.iterdir():
            _flush(child)
    elif not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty (the saved file, or another writer's), or not ours to remove
