"""What killed runs leave behind, and its removal by the next run.

Every save writes under a hidden name and renames into place (:func:`.staging.staged`,
for the datasets and the resolved base model), and train and merge build their models in
hidden work folders. A run killed midway leaves these behind. No load ever picks them up,
but a killed merge of a 7B model leaves 15 GB of them. Their names carry the writer's host
(hashed) and pid, so that the next run can remove those whose writer is gone and leave alone
the ones of runs still going: two data_prep runs at once, or a run on another machine that
shares the data folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

HOST_ID = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
# The prefixes of the work folders that nodes make with work_dir().
WORK_PREFIXES = ("merge", "training-result", "convert")
_STAGING = re.compile(r"\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}\.partial$")
# Kedro's version names (kedro.io.core.generate_timestamp).
KEDRO_VERSION = re.compile(r"\d{4}-\d\d-\d\dT\d\d\.\d\d\.\d\d\.\d{3}Z")
_WORK = re.compile(rf"^\.(?:{'|'.join(WORK_PREFIXES)})-(?P<host>[0-9a-f]{{8}})-(?P<pid>\d+)-")


def owner_tag() -> str:
    return f"{HOST_ID}-{os.getpid()}"


def staging_path(final: Path) -> Path:
    """The hidden sibling that ``final`` is written to before it is renamed into place."""
    return final.with_name(f".{final.name}.{owner_tag()}-{uuid.uuid4().hex[:8]}.partial")


def work_dir(prefix: str, parent: str | Path | None = None) -> Path:
    """A new hidden work folder (``prefix`` one of :data:`WORK_PREFIXES`) in ``parent`` (the
    system's temporary folder when None)."""
    if prefix not in WORK_PREFIXES:
        raise ValueError(f"work folder prefix {prefix!r}: expected one of {WORK_PREFIXES}")
    path = Path(tempfile.mkdtemp(prefix=f".{prefix}-{owner_tag()}-", dir=parent))
    if parent is not None:
        # mkdtemp makes it 0700, and a folder built here is published as it is (a merged
        # model that others sharing the disk load): it takes the mode of the folder it is in.
        path.chmod(Path(parent).stat().st_mode & 0o777)
    return path


@contextlib.contextmanager
def temporary_work_dir(prefix: str, parent: str | Path | None = None) -> Iterator[Path]:
    """:func:`work_dir`, removed when the block ends."""
    path = work_dir(prefix, parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove(path: Path) -> None:
    """Remove a file, link or folder tree, whichever ``path`` is; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (perhaps a new one with a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_if_empty_version(folder: Path) -> None:
    """A Kedro version folder that held only a killed run's save: no load looks into an
    empty one, but a reader listing the versions would take it for a run's output."""
    if KEDRO_VERSION.fullmatch(folder.name):
        with contextlib.suppress(OSError):  # not empty: another save of the version is there
            folder.rmdir()


def is_orphaned(name: str) -> bool:
    """Whether ``name`` is a staging file or work folder of a process of this host that is
    gone."""
    match = _STAGING.search(name) or _WORK.match(name)
    return bool(match) and match["host"] == HOST_ID and not pid_alive(int(match["pid"]))


def sweep(trees: Iterable[Path], flat: Iterable[Path] = ()) -> list[Path]:
    """Remove orphaned staging files and work folders anywhere under ``trees`` and directly
    in ``flat`` (the temporary folder: not walked, it may be large and not ours).

    Returns:
        What was removed.
    """
    found: list[Path] = []
    for tree in trees:
        for parent, dirs, files in os.walk(tree):
            found += [Path(parent, f) for f in files if f.startswith(".") and is_orphaned(f)]
            orphaned = [d for d in dirs if d.startswith(".") and is_orphaned(d)]
            found += [Path(parent, d) for d in orphaned]
            dirs[:] = [d for d in dirs if d not in orphaned]
    for folder in flat:
        try:
            found += [p for p in Path(folder).iterdir() if p.name.startswith(".")
                      and is_orphaned(p.name)]
        except OSError:
            continue
    for path in found:
        remove(path)
        _remove_if_empty_version(path.parent)
    if found:
        logger.info("removed %d leftover(s) of killed runs: %s", len(found),
                    ", ".join(str(p) for p in found[:5]) + (" ..." if len(found) > 5 else ""))
    return found
