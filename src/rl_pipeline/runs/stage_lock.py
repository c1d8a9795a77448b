"""A lock per stage and project, so a scheduled run never overlaps a run of the same stage.

A scheduler fires on time whether or not the last run has finished: a nightly train that
took 26 hours would otherwise start a second one on the same GPUs and checkpoint folder. So
a *scheduled* run (``RL_PIPELINE_SCHEDULED=1``, set by ``scripts/scheduled_run.sh`` and the
Airflow DAGs) takes the stage's lock exclusively and, when any other run of that stage holds
it, stops at once with :data:`LOCKED_EXIT_CODE`. Runs started by hand take the lock shared:
they keep a scheduled run out, but not each other, because every run writes its own dataset
versions and someone at a terminal may well want two data_prep runs side by side. A run by
hand that finds a scheduled run holding the lock goes ahead, with a warning; it cannot share
a lock held exclusively, so every run by hand also holds ``<stage>.by-hand.lock`` shared, which
a scheduled run checks too: when that scheduled run ends or dies while the run by hand goes
on, the next scheduled run still finds it (it started beside it before).

The locks are ``flock`` locks on ``<stage>.lock`` in ``folders.locks`` (conf/base/globals.yml:
``data/.locks``), so they go with the process that holds them, even when it is killed: no
stale lock ever needs clearing by hand.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from rl_pipeline.errors import UserError

logger = logging.getLogger(__name__)

SCHEDULED_ENV = "RL_PIPELINE_SCHEDULED"
# The stages one `kedro run` runs, each in a session of its own (set by rl_pipeline.cli): a
# scheduled command checks them all as its first stage starts, so that it stops before any
# work rather than after its first stages (a second scheduled __default__ had run data_prep,
# then stopped at train).
COMMAND_STAGES_ENV = "RL_PIPELINE_COMMAND_STAGES"
# EX_TEMPFAIL (sysexits.h), "try again later": a scheduler can tell a skipped run from a
# failed one (systemd: SuccessExitStatus=75).
LOCKED_EXIT_CODE = 75


class StageLockedError(UserError, RuntimeError):
    """A scheduled run found another run of the same stage in the same project."""


def is_scheduled() -> bool:
    """Whether this process was started by a scheduler (``RL_PIPELINE_SCHEDULED``)."""
    return os.environ.get(SCHEDULED_ENV, "").strip().lower() not in ("", "0", "false", "no")


# Held shared by every run started by hand, beside ``<stage>.lock``.
HAND_SUFFIX = ".by-hand.lock"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _lock(fd: int, kind: int) -> str | None:
    """Take ``kind`` on ``fd`` without waiting: None when taken, else who holds it."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
    return None


def _mark(fd: int, how: str) -> None:
    # With shared holders the file names the latest one: enough to find a culprit.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, {how}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
              .encode(), 0)


class StageLocks:
    """The locks one run holds on its stages, in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held: list[int] = []

    def acquire(self, stages: Iterable[str], scheduled: bool) -> None:
        """Lock ``stages`` (exclusively when ``scheduled``), or lock none of them.

        Raises:
            StageLockedError: ``scheduled`` and another run holds one of the stages.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        for stage in stages:
            if scheduled:
                self._take_scheduled(stage)
            else:
                self._take_by_hand(stage)

    def _take_scheduled(self, stage: str) -> None:
        path = self.folder / f"{stage}.lock"
        fd = _open(path)
        holder = _lock(fd, fcntl.LOCK_EX)
        if holder is None:
            # Runs by hand that started while a scheduled one held the stage hold only this.
            hand = _open(self.folder / f"{stage}{HAND_SUFFIX}")
            holder = _lock(hand, fcntl.LOCK_EX)
            os.close(hand)  # a probe: runs by hand may start beside this one, with a warning
            if holder is None:
                _mark(fd, "scheduled")
                self._held.append(fd)
                return
        os.close(fd)
        self.release()
        raise StageLockedError(
            f"stage {stage} is already running in this project ({holder}); this "
            f"scheduled run stops without doing anything. Lock: {path}")

    def _take_by_hand(self, stage: str) -> None:
        fd = _open(self.folder / f"{stage}.lock")
        holder = _lock(fd, fcntl.LOCK_SH)
        if holder is None:
            _mark(fd, "started by hand")
            self._held.append(fd)
        else:
            os.close(fd)
            logger.warning("a scheduled run of stage %s is running in this project (%s); this "
                           "run goes ahead and writes its own versions", stage, holder)
        # Always held, so that a scheduled run that starts after that one ended (or died)
        # still finds this one. Only a scheduled run's probe takes it exclusively, for an
        # instant: a short wait rather than none.
        hand = _open(self.folder / f"{stage}{HAND_SUFFIX}")
        deadline = time.monotonic() + 5
        while _lock(hand, fcntl.LOCK_SH) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        _mark(hand, "started by hand")
        self._held.append(hand)

    def check_free(self, stages: Iterable[str]) -> None:
        """Refuse now, as :meth:`acquire` would for a scheduled run, when another run holds
        one of ``stages``; hold none of them.

        Raises:
            StageLockedError: Another run holds one of the stages.
        """
        probe = StageLocks(self.folder)
        probe.acquire(stages, scheduled=True)
        probe.release()

    def release(self) -> None:
        while self._held:
            os.close(self._held.pop())  # closing the descriptor drops the flock
