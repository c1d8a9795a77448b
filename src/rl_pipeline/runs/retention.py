"""Old versions of the model folders, and their removal (``kedro prune``).

Every train writes a training result and every merge a merged model as a new Kedro version,
and nothing removes them: a scheduled weekly cycle adds a merged model each time (517 MB for
SmolLM2-135M, some 15 GB for a 7B model), also when its weights equal the last one's. This
keeps the newest ``keep`` versions of each model folder dataset and every version that an
alias of the registry points at (champion, candidate), and removes the rest: each folder is
first renamed to a hidden staging name (:func:`rl_pipeline.runs.debris.staging_path`), so
no reader ever sees half a version, and a prune killed midway leaves only what the next
run's sweep removes.

Kedro has no retention of its own for versioned datasets, hence this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rl_pipeline.runs.debris import KEDRO_VERSION, remove, staging_path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionFolder:
    """One version of a dataset, and why it stays (None: it goes)."""

    dataset: str
    path: Path
    size: int
    kept_because: str | None

    @property
    def version(self) -> str:
        return self.path.name


def versions(folder: Path) -> list[Path]:
    """The Kedro versions in ``folder``, oldest first (their names are timestamps)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and KEDRO_VERSION.fullmatch(p.name))


def plan(datasets: Mapping[str, Path], keep: int, protected: Mapping[Path, str]
         ) -> list[VersionFolder]:
    """Every version of ``datasets`` (name -> versioned path), each kept or not.

    A version counts when it holds the dataset (``<path>/<version>/<path's name>``); one that
    does not is a save in progress or a killed one's, and stays: the next run's sweep removes
    what a killed run left (:mod:`rl_pipeline.runs.debris`).

    Args:
        datasets: The versioned paths, as the catalog names them.
        keep: How many of the newest complete versions of each stay.
        protected: Folders that stay whatever their age (a version, or the dataset in it),
            with the reason.

    Raises:
        ValueError: ``keep`` is below 1: the newest version is what the next stage reads.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: at least 1 (the newest version is what the next "
                         "stage reads)")
    held = {path.resolve(): why for path, why in protected.items()}
    found: list[VersionFolder] = []
    for name, path in datasets.items():
        every = versions(path)
        complete = [v for v in every if (v / path.name).exists()]
        newest = set(complete[-keep:])
        for version in every:
            why = (held.get(version.resolve()) or held.get((version / path.name).resolve())
                   or (f"one of the newest {keep}" if version in newest else None)
                   or (None if version in complete else
                       f"no {path.name} in it: a save in progress, or a killed one's"))
            found.append(VersionFolder(name, version, _size(version), why))
    return found


def remove_versions(entries: Iterable[VersionFolder]) -> list[VersionFolder]:
    """Remove the versions that :func:`plan` did not keep.

    Returns:
        Those removed.
    """
    removed = []
    for entry in entries:
        if entry.kept_because is not None:
            continue
        hidden = staging_path(entry.path)
        entry.path.rename(hidden)  # one step: the version is there whole or gone
        remove(hidden)
        removed.append(entry)
        logger.info("removed %s version %s (%s)", entry.dataset, entry.version,
                    human_size(entry.size))
    return removed


def human_size(size: float) -> str:
    """``size`` bytes in B, KiB, MiB or GiB."""
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


def _size(folder: Path) -> int:
    return sum(os.lstat(Path(parent, f)).st_size
               for parent, _, files in os.walk(folder) for f in files)
