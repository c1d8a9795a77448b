"""The process's stop handlers, kept across ``ray.init``."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator
from typing import Any


class StopHandlers:
    """This process's SIGTERM and SIGHUP handlers, kept across verl's start of Ray.

    ``run_ppo`` calls ``ray.init``, which installs Ray's own SIGTERM handler (``sys.exit``),
    and Ray's core then aborts the process on SIGTERM: a scheduler's stop ended the stage
    with SIGABRT and its MLflow run RUNNING, not as the handlers that ``kedro run`` installed
    (:mod:`rl_pipeline.cli`) end it (exit 143, the run FAILED, "stopped by SIGTERM"), and
    Ray's handler stayed after ``ray.shutdown`` for the merge and eval that follow. verl
    starts Ray inside ``run_ppo`` and then waits in ``ray.get`` until training ends, so the
    one moment to put ours back is as ``ray.init`` returns: :meth:`across_ray_init` wraps it
    for the block, and :meth:`restore` puts them back after Ray is shut down (the cluster
    preflight's own ``ray.init`` too).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        self.kept = {s: signal.getsignal(s) for s in self.SIGNALS} if main else {}

    def restore(self) -> None:
        """Ours back where another Python handler (Ray's) took its place. One set to the
        default stays: the CLI's handler does that as it raises, so that a second signal
        ends the process at once."""
        for signum, handler in self.kept.items():
            now = signal.getsignal(signum)
            if handler is not None and callable(now) and now is not handler:
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def across_ray_init(self) -> Iterator[None]:
        import ray

        init = ray.init

        @functools.wraps(init)
        def init_keeping_handlers(*args: Any, **kwargs: Any) -> Any:
            try:
                return init(*args, **kwargs)
            finally:
                self.restore()

        ray.init = init_keeping_handlers
        try:
            yield
        finally:
            ray.init = init
