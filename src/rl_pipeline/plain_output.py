"""Output off a terminal (cron's log, CI, a pipe into tee): one plain line per record and
no progress bars, in this process and in those it starts.

On a terminal a run shows Kedro's rich records and the libraries' progress bars. Written to
a file, a bar is a line of carriage returns that grows with every update, and rich wraps
each record at 80 columns, so a record that ``grep`` should find is spread over six lines.
Off a terminal, then, logging is :data:`PLAIN_LOGGING_FILE`'s, and the bars are off:
tqdm's and huggingface_hub's own switches (``TQDM_DISABLE``, read as tqdm is imported;
``HF_HUB_DISABLE_PROGRESS_BARS``), set in the environment for the processes a run starts
(Ray's workers, verl's trainer), and huggingface_hub's and transformers' functions for this
process, where tqdm is already imported (transformers' weight loading and the like; a bar of
tqdm's own that a library starts here, such as the GGUF conversion's, stays unless
``TQDM_DISABLE`` was set before the run, as scripts/scheduled_run.sh does). A trainer shows
its progress as one logged line per step instead (:func:`progress_bars_shown` tells it
which).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rl_pipeline.runs.environment import environ

PLAIN_LOGGING_FILE = Path(__file__).with_name("plain_logging.yml")
LOGGING_CONFIG_ENV = "KEDRO_LOGGING_CONFIG"
NO_PROGRESS_BARS_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def plain_logging() -> dict[str, Any]:
    """The logging configuration of :data:`PLAIN_LOGGING_FILE`."""
    return yaml.safe_load(PLAIN_LOGGING_FILE.read_text(encoding="utf-8"))


def progress_bars_shown() -> bool:
    """Whether this process shows progress bars: on a terminal, unless turned off."""
    return sys.stdout.isatty() and not os.environ.get("TQDM_DISABLE")


def _own_configuration() -> bool:
    """Whether the user named a logging configuration of their own."""
    named = os.environ.get(LOGGING_CONFIG_ENV)
    return bool(named) and Path(named).resolve() != PLAIN_LOGGING_FILE.resolve()


@contextlib.contextmanager
def plain_output_off_a_terminal() -> Iterator[None]:
    """For the block: off a terminal, and unless the user named a logging configuration of
    their own, plain logging and no progress bars (see the module's docstring); then the
    environment and transformers' bars as they were, so that a second command in the same
    process (a notebook, a test) starts clean."""
    if sys.stdout.isatty() or _own_configuration():
        yield
        return
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from kedro.framework.project import LOGGING

    LOGGING.configure({**plain_logging(), "loggers": dict(LOGGING.data.get("loggers", {}))})
    logging.captureWarnings(True)  # as Kedro's rich handler does
    # warnings' own format adds the source line below the message: a record of two lines.
    formatwarning, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    wanted = {LOGGING_CONFIG_ENV: str(PLAIN_LOGGING_FILE), **NO_PROGRESS_BARS_ENV}
    bars = not are_progress_bars_disabled()
    disable_progress_bars()  # transformers, imported later, takes this as its own default
    _transformers_bars(False)
    try:
        with environ(**{name: os.environ.get(name) or value for name, value in wanted.items()}):
            yield
    finally:
        if bars:
            enable_progress_bars()
            _transformers_bars(True)
        warnings.formatwarning = formatwarning


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    return f"{filename}:{lineno}: {category.__name__}: {message}"


def _transformers_bars(shown: bool) -> None:
    """transformers' own switch, where it is imported already (importing it costs a second
    that the promote stage does not otherwise pay)."""
    if "transformers.utils.logging" in sys.modules:
        from transformers.utils import logging as transformers_logging

        (transformers_logging.enable_progress_bar if shown
         else transformers_logging.disable_progress_bar)()
