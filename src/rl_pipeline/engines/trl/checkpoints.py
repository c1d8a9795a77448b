"""The newest checkpoint a TRL run can resume from.

transformers writes ``checkpoint-N`` in place, ``trainer_state.json`` last, and its
``get_last_checkpoint`` takes the newest folder whatever it holds: a run killed while saving
left a folder that every later rerun resumed from and failed on (``No such file or
directory: .../trainer_state.json``), so a killed train could never resume on its own.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from rl_pipeline.runs.jsonfile import read_object

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME, written last
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(folder: str | Path, discard_incomplete: bool = False) -> Path | None:
    """The newest ``checkpoint-N`` in ``folder`` whose save finished (its trainer state is
    there and reads: transformers truncates and rewrites it in place), or None.

    Args:
        folder: The run's checkpoint folder.
        discard_incomplete: Remove newer folders whose save did not finish (for a run about
            to resume: the trainer would save into them again), with a warning.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                    if p.is_dir() and (m := _CHECKPOINT.match(p.name))), reverse=True)
    for _, path in found:
        if read_object(path / STATE_FILE):
            return path
        if discard_incomplete:
            logger.warning("%s is incomplete (no readable %s: the run was killed, or the disk "
                           "filled, while saving it); removed, resuming from the checkpoint "
                           "before it", path, STATE_FILE)
            shutil.rmtree(path)
    return None
