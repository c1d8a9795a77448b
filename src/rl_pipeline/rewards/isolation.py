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
a Ray actor's threads and their locks.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

# What the forkserver imports before it forks a worker: the built-in scorers and verl's.
PRELOAD = ["rl_pipeline.rewards.scoring"]
MAX_WORKERS = 8


class RewardTimeout(TimeoutError):
    """The reward function ran past ``reward.timeout_s`` on one sample."""


_pools: dict[int, Any] = {}  # one pool per process (a fork must not reuse its parent's)
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


def _pool() -> Any:
    from pebble import ProcessPool

    with _lock:
        pool = _pools.get(os.getpid())
        if pool is None or not pool.active:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            pool = _pools[os.getpid()] = ProcessPool(max_workers=workers(), context=context)
            atexit.register(_stop, pool)
        return pool


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

    return load_reward_function_cached(path, name)(*args)
