"""Errors that are the user's to fix, told apart from bugs.

A bad parameter, a malformed record, a missing file: the project's message already says
where and what to change, so `kedro run` (:mod:`rl_pipeline.cli`) prints that message alone,
``Error: ...``, instead of a rich traceback of Kedro's and pluggy's frames around it. Any
other exception is a bug, or a failure nobody foresaw, and keeps its whole traceback.
``RL_PIPELINE_TRACEBACK=1`` shows the traceback of a user error too.

The project's exception classes for such problems derive from :class:`UserError` (besides
the built-in class they always had, so ``except ValueError`` still catches them). This
module imports nothing of the project's, so the lowest layers (the parameters, the training
result record) may use it. A few of Kedro's own are user errors too: a parameter that fails
validation, a dataset that cannot find or read its file.
"""

from __future__ import annotations

import os
import signal

TRACEBACK_ENV = "RL_PIPELINE_TRACEBACK"
TRACEBACK_HINT = f"({TRACEBACK_ENV}=1 shows the traceback)"


class UserError(Exception):
    """A problem in what the user gave (a parameter, the data, a file, this machine), which the
    message names with what to change; its traceback would add nothing."""


class Terminated(Exception):  # noqa: N818 (a stop, named as the signal's man page does)
    """The process was asked to stop (SIGTERM, SIGHUP); raised where it was, as an error
    (:mod:`rl_pipeline.cli` installs the handlers that raise it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def terminated(exc: BaseException | None) -> Terminated | None:
    """The :class:`Terminated` behind ``exc`` (Kedro wraps what a save raised; Python wraps
    what a handler raised inside a C call, Ray's ``ray.get``, in a SystemError)."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, Terminated):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _cause(exc: BaseException) -> BaseException | None:
    """What ``exc`` wraps: its explicit cause (``raise ... from``), or the exception it was
    raised while handling when its message quotes that one's (a wrapper that did not say
    ``from``). An unrelated error raised in an ``except`` block is not a wrapper: a bug in
    handling a user error stays a bug."""
    if exc.__cause__ is not None:
        return exc.__cause__
    context = exc.__context__
    if context is not None and not exc.__suppress_context__ and str(context) \
            and str(context) in str(exc):
        return context
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 32:
        chain.append(current)
        current = _cause(current)
    return chain


def _is_user_error(exc: BaseException) -> bool:
    # Kedro is imported here, so that the modules defining user errors import this one freely.
    from kedro.config import MissingConfigException
    from kedro.io import DatasetError
    from kedro.validation.exceptions import ParameterValidationError

    # Kedro's two are always about the configuration the user wrote.
    if isinstance(exc, (UserError, ParameterValidationError, MissingConfigException)):
        return True
    if isinstance(exc, DatasetError):
        # Kedro's "Failed while loading data from dataset ..." carries the dataset's own
        # error as its cause: a missing or unreadable file is the user's, a TypeError is not.
        cause = _cause(exc)
        return cause is None or isinstance(cause, OSError) or _is_user_error(cause)
    return False


def user_error(exc: BaseException) -> BaseException | None:
    """The user error that ``exc`` is or wraps (Kedro wraps what a dataset raises), or None
    when ``exc`` is a bug.

    A plain ``FileNotFoundError`` counts when raised as such (a reward file, a model folder
    the parameters name), not deep in the chain of another error: there it is some step's
    detail, and the other error's traceback says which step.
    """
    if isinstance(exc, FileNotFoundError):
        return exc
    return next((e for e in _chain(exc) if _is_user_error(e)), None)


def user_message(exc: BaseException, found: BaseException) -> str:
    """What to print for ``exc``, which is or wraps the user error ``found``: the outermost
    message when it quotes the user error's (it adds where), else the user error's own."""
    outer, inner = str(exc).strip(), str(found).strip()
    return outer if inner in outer else inner or type(found).__name__


def show_tracebacks() -> bool:
    """Whether the user asked for the traceback of user errors too."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")
