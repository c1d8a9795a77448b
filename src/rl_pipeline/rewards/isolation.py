"""Reward functions in worker processes, with a time limit per sample that holds on any thread.

A reward scores arbitrary model output, and some inputs make a scorer run for minutes
(math-verify simplifying a monster expression, a regular expression backtracking). The
trainers call rewards where a signal-based limit cannot work: verl's reward loop on an
executor thread (``loop.run_in_executor``), a Ray actor, TRL on the main thread, eval. A
thread cannot be stopped either. So each call runs in a worker process of a pool owned by
the calling process; a call past its limit has its worker killed (and replaced), and the
caller gets :class:`RewardTimeout` (verl PRs #5839 and #6673 met the same hang and moved
math-verify into processes).

The pool is pebble's ``ProcessPool``, which kills a timed-out worker (the standard
``ProcessPoolExecutor`` can only stop waiting for it). Workers come from a forkserver that
has imported the built-in scorers once, so starting one (at first use, and after a kill)
costs a fork, not verl's 5-second import; forking the calling process instead would copy
a Ray actor's threads and their locks. A worker imports the reward files of this process's
rewards (:func:`register`) before it takes a sample, so a file's import (torch, a
classifier) does not count against the first sample's limit, nor against the first after a
kill.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

# What the forkserver imports before it forks a worker: the built-in scorers and verl's.
PRELOAD = ["rl_pipeline.rewards.scoring"]
MAX_WORKERS = 8
# A worker's import of the reward files before its first sample may take this long; past it
# the worker gives up and each sample imports within its own limit (as before preloading).
IMPORT_LIMIT_S = 300


class RewardTimeout(TimeoutError):
    """The reward function ran past ``reward.timeout_s`` on one sample."""


class RewardRaised(RuntimeError):
    """The reward function raised (or called ``sys.exit``) in its worker process. It comes
    back as this, with the original's type, message and line, because the original may not
    cross back: a class the reward file defines does not unpickle everywhere, and a
    ``SystemExit`` would end the caller."""


_pools: dict[int, Any] = {}  # one pool per process (a fork must not reuse its parent's)
_preloaded: dict[int, frozenset] = {}  # the sources each process's pool imports in its workers
_sources: set[tuple[str | None, str]] = set()  # the (path, name) this process's rewards call
_lock = threading.Lock()
_peers = 1  # processes of the run with a pool of their own on these cores (share_cores)


def share_cores(processes: int) -> None:
    """Size this process's pool as one of ``processes`` that score beside each other
    (verl's reward workers, 8 by default), before its first sample. A Ray actor sees every
    core of its node, so each of 8 workers took min(8, cores) scorer processes: 64 on the
    lent H100's 16 cores, each importing verl when the run starts."""
    global _peers
    _peers = max(1, processes)


def workers() -> int:
    """How many samples a process scores at once: its share of the cores
    (:func:`share_cores`), at least 1 and at most :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) // _peers))


def register(path: str | None, name: str) -> None:
    """Have this process's scorer workers import ``path`` before their first sample (a
    reward that runs in them; :class:`~rl_pipeline.rewards.scoring.SafeReward` registers
    its own). A pool started before a new file is registered is replaced at its next use."""
    if path:
        with _lock:
            _sources.add((path, name))


def _pool() -> Any:
    from pebble import ProcessPool

    pid = os.getpid()
    with _lock:
        pool = _pools.get(pid)
        sources = frozenset(_sources)
        if pool is not None and pool.active and not sources <= _preloaded[pid]:
            # Its pending samples finish, then it stops (a closed pebble pool keeps its
            # workers until joined); new samples go to the new pool.
            pool.close()
            threading.Thread(target=pool.join, daemon=True).start()
            pool = None
        if pool is None or not pool.active:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            pool = _pools[pid] = ProcessPool(max_workers=workers(), context=context,
                                             initializer=_preload, initargs=(sorted(sources),))
            _preloaded[pid] = sources
            atexit.register(_stop, pool)
        return pool


def _preload(sources: list[tuple[str, str]]) -> None:
    """A worker's start: import each reward file, within :data:`IMPORT_LIMIT_S` (its main
    thread: an alarm works). What fails or takes too long is left to the sample's own call,
    which then raises it within the sample's limit."""
    from rl_pipeline.rewards.scoring import load_reward_function_cached

    def give_up(*_: Any) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(IMPORT_LIMIT_S)
    try:
        for path, name in sources:
            try:  # each on its own: one that fails leaves the others preloaded
                load_reward_function_cached(path, name)
            except (Exception, SystemExit):
                continue
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def warm() -> None:
    """Start this process's pool now, without waiting for it: its forkserver's import and
    its workers' start then overlap whatever the caller does before its first sample
    (:func:`~rl_pipeline.rewards.scoring.prepare_verl_reward` says where that pays).
    """
    _pool().schedule(_noop)


def _noop() -> None:
    return None


def _stop(pool: Any) -> None:
    pool.stop()
    pool.join(timeout=5)


def call_with_limit(path: str | None, name: str, args: tuple, timeout_s: float) -> Any:
    """``load_reward_function(path, name)(*args)`` in a worker process, within ``timeout_s``.

    Raises:
        RewardTimeout: The call ran past the limit; its worker was killed.
        Exception: Whatever the reward function raised, as it raised it.
    """
    future = _pool().schedule(_call, args=(path, name, args), timeout=timeout_s)
    try:
        return future.result()
    except FutureTimeout:
        raise RewardTimeout(f"ran past reward.timeout_s={timeout_s:g} s on one sample (its "
                            "worker process was stopped)") from None


def _call(path: str | None, name: str, args: tuple) -> Any:
    from rl_pipeline.rewards.scoring import load_reward_function_cached

    try:
        return run(load_reward_function_cached(path, name), args)
    except BaseException as exc:  # what may not cross back (a class of the reward file, exit)
        raise RewardRaised(describe(exc)) from None


def run(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)``, awaited when ``fn`` is a coroutine function (verl's reward loop awaits
    an ``async def`` reward; here it runs on an event loop of its own)."""
    result = fn(*args)
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def describe(exc: BaseException) -> str:
    """``Type: message (file:line in function)``: what a reward raised and the line that
    raised it, in one line for the log and the reward self-test."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
