"""A lock per stage and project, so a scheduled run never overlaps a run of the same stage.

A scheduler fires on time whether or not the last run has finished: a nightly train that
took 26 hours would otherwise start a second one on the same GPUs and checkpoint folder. So
a *scheduled* run (``RL_PIPELINE_SCHEDULED=1``, set by ``scripts/scheduled_run.sh`` and the
Airflow DAGs) takes the stage's lock exclusively and, when any other run of that stage holds
it, stops at once with :data:`LOCKED_EXIT_CODE`. Runs started by hand take the lock shared:
they keep a scheduled run out, but not each other, because every run writes its own dataset
versions and someone at a terminal may well want two data_prep runs side by side. A run by
hand that finds a scheduled run holding the lock goes ahead, with a warning.

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
            path = self.folder / f"{stage}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if scheduled else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if not scheduled:
                    logger.warning("a scheduled run of stage %s is running in this project (%s);"
                                   " this run goes ahead and writes its own versions", stage,
                                   holder)
                    continue
                self.release()
                raise StageLockedError(
                    f"stage {stage} is already running in this project ({holder}); this "
                    f"scheduled run stops without doing anything. Lock: {path}") from None
            # With shared holders the file names the latest one: enough to find a culprit.
            os.ftruncate(fd, 0)
            os.pwrite(fd, (f"pid {os.getpid()}, {'scheduled' if scheduled else 'started by hand'}"
                           f", since {time.strftime('%Y-%m-%d %H:%M:%S')}").encode(), 0)
            self._held.append(fd)

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
