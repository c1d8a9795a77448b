"""The command the user typed, and the same command for one stage of it: what a train run's
``stage_command`` tag and the trl engine's ``train_command.sh`` say to run again."""

from __future__ import annotations

import os
import shlex

# The command the user typed (rl_pipeline.cli sets it for every stage it runs): kedro-mlflow's
# kedro_command tag names what Kedro's session ran, `kedro run --pipeline=eval`, without the
# environment and parameters, also when the user ran the whole pipeline.
COMMAND_ENV = "RL_PIPELINE_COMMAND"
# Options that choose what runs; one stage's command replaces them with --pipelines <stage>.
_SELECTING = ("--pipelines", "--pipeline", "-p")


def typed_command() -> str | None:
    """``kedro run ...`` as the user typed it; None where no such command runs this process
    (a scheduler's task, a test)."""
    return os.environ.get(COMMAND_ENV) or None


def stage_command(stage: str) -> str | None:
    """The typed command for ``stage`` alone: its environment, parameters and other options,
    with ``--pipelines <stage>`` for whatever pipelines it chose; None as for
    :func:`typed_command`."""
    typed = typed_command()
    if typed is None:
        return None
    words, kept = iter(shlex.split(typed)), []
    for word in words:
        if word in _SELECTING:
            next(words, None)  # its value
        elif not word.startswith(tuple(f"{option}=" for option in _SELECTING)):
            kept.append(word)
    return shlex.join([*kept, "--pipelines", stage])
