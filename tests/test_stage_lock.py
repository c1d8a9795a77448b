"""The stage locks in one process: flock locks belong to each open file, so two StageLocks
here behave as two runs would."""

from __future__ import annotations

import pytest

from rl_pipeline.runs.stage_lock import StageLockedError, StageLocks


def test_a_run_by_hand_beside_a_scheduled_one_still_keeps_the_next_scheduled_one_out(
        tmp_path, caplog) -> None:
    scheduled = StageLocks(tmp_path)
    scheduled.acquire(["train"], scheduled=True)
    by_hand = StageLocks(tmp_path)
    by_hand.acquire(["train"], scheduled=False)  # goes ahead, with a warning
    assert "a scheduled run of stage train is running in this project" in caplog.text
    scheduled.release()  # the scheduled run ends, or dies, while the run by hand goes on
    with pytest.raises(StageLockedError, match=r"stage train is already running in this "
                                               r"project \(pid \d+, started by hand"):
        StageLocks(tmp_path).acquire(["train"], scheduled=True)
    by_hand.release()
    after = StageLocks(tmp_path)
    after.acquire(["train"], scheduled=True)  # nothing holds it now
    # Runs by hand never keep each other out, nor wait on a scheduled one.
    StageLocks(tmp_path).acquire(["train"], scheduled=False)
    StageLocks(tmp_path).acquire(["train"], scheduled=False)
    after.release()
