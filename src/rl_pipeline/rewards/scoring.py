"""Reward functions with verl's signature, the custom-function loader, and error containment."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import inspect
import logging
import math
import numbers
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score import gsm8k as verl_gsm8k

from rl_pipeline.errors import UserError
from rl_pipeline.params.reward import BUILTIN_NAMES, JUDGE, REGEX
from rl_pipeline.rewards.form import MAX_RESPONSE_LENGTH, RESPONSE_LENGTH, form
from rl_pipeline.rewards.judge import PARTS as JUDGE_PARTS
from rl_pipeline.rewards.judge import Judge
from rl_pipeline.rewards.sandbox import code_tests
from rl_pipeline.rewards.text_answers import RegexAnswer, choice, exact_match

if TYPE_CHECKING:
    from rl_pipeline.params import RewardParams

logger = logging.getLogger(__name__)

RewardFunction = Callable[..., "float | dict[str, Any]"]
# (data_source, solution_str, ground_truth, extra_info): one sample, as score() takes it
Sample = tuple[str, str, str, "dict | None"]
T = TypeVar("T")

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
PKG = "pkg://"  # verl's prefix for a reward module imported by name, not by file path
_CLIP = 300  # verl's GSM8K scorer also looks at the last 300 characters only
# Small next to a correct answer's 1.0, so the format alone never pays more than being right.
FORMAT_CREDIT = 0.1

# data_source values whose answers are GSM8K's "#### <number>": compute_score picks GSM8K's
# strict score for them, and eval reports GSM8K's strict and flexible accuracy.
GSM8K_SOURCES = {"openai/gsm8k", "gsm8k", "rl_pipeline/arithmetic"}
MATH_SOURCES = {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                "math"}
# data_source values for text answers (rl_pipeline.rewards.text_answers): the final answer
# equal to the ground truth after normalisation, or the option it picks.
EXACT_MATCH_SOURCES = {"exact_match"}
CHOICE_SOURCES = {"choice"}
# data_source values for code with unit tests: run in the sandbox (rl_pipeline.rewards.sandbox)
CODE_TESTS_SOURCES = {"code_tests"}


def strict_gsm8k(data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None) -> float:
    """1.0 when the last number after ``####`` equals the ground truth (verl's GSM8K score)."""
    return float(verl_gsm8k.compute_score(solution_str, str(ground_truth), method="strict"))


def flexible_gsm8k(data_source: str, solution_str: str, ground_truth: str,
                   extra_info: dict | None = None) -> float:
    """1.0 when the last number in the response equals the ground truth as a number.

    Like verl's ``method="flexible"`` (last number, in the last 300 characters), except that
    the number is compared by value, so "The answer is 72." and "$1,000" count: verl compares
    the raw match ("72.") as a string and scores those 0.
    """
    numbers = _NUMBER.findall(solution_str[-_CLIP:])
    return 1.0 if numbers and _same_number(numbers[-1], str(ground_truth)) else 0.0


def gsm8k_format_credit(data_source: str, solution_str: str, ground_truth: str,
                        extra_info: dict | None = None) -> float:
    """A correct answer scores 1.0, a wrong but well-formed one :data:`FORMAT_CREDIT`.

    On GSM8K-style sources (:data:`GSM8K_SOURCES`), by :func:`~rl_pipeline.rewards.form.form`:

    - 1.0: exactly one ``#### <number>`` answer, equal to the ground truth as a number, and
      the response does not repeat itself;
    - :data:`FORMAT_CREDIT`: a wrong answer in a well-formed response: one ``#### <number>``,
      not repetitive, and ended by itself (not cut off by the length cap, as ``extra_info``
      reports it: :data:`~rl_pipeline.rewards.form.TRUNCATED`);
    - 0 otherwise: no answer, several ``####`` answers, a repetitive or a truncated one.

    A small model rarely answers correctly at first, so without the credit most GRPO groups
    score all zeros and carry no advantage. The credit pays only for a complete, single,
    non-repetitive answer: ``#### 10`` repeated to the length cap, a guess in the format
    with nothing to stop it, earns nothing. Other data sources score as :func:`compute_score`.
    """
    if data_source not in GSM8K_SOURCES:
        return compute_score(data_source, solution_str, ground_truth, extra_info)
    shape = form(solution_str, extra_info)
    if shape.answer is None or shape.repetitive:
        return 0.0
    if _same_number(shape.answer, str(ground_truth)):
        return 1.0
    return FORMAT_CREDIT if shape.well_formed else 0.0


def well_formed(data_source: str, solution_str: str, ground_truth: str,
                extra_info: dict | None = None) -> float:
    """1.0 for a well-formed GSM8K-style response, right or wrong: one ``#### <number>``
    answer, not repetitive, ended by itself (:func:`~rl_pipeline.rewards.form.form`). A
    format term for ``reward.terms``; it ignores the ground truth."""
    shape = form(solution_str, extra_info)
    return 1.0 if shape.answer is not None and shape.well_formed else 0.0


def math_verify_score(data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> float:
    """1.0 when math-verify finds the response's answer (``\\boxed{}`` or an expression)
    equivalent to the ground truth.

    math-verify's own time limits are off: they are SIGALRM-based, which raises off the
    main thread (verl's reward loop calls this on an executor thread). ``reward.timeout_s``
    limits it instead, from outside (:mod:`rl_pipeline.rewards.isolation`).
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # It warns at every call that its timeout is off: that is meant, and said above.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse("\\boxed{" + str(ground_truth) + "}", (LatexExtractionConfig(),),
                 parsing_timeout=None)
    answer = parse(solution_str, (ExprExtractionConfig(), LatexExtractionConfig()),
                   parsing_timeout=None)
    return 1.0 if gold and answer and verify(gold, answer, timeout_seconds=None) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None) -> float | dict[str, Any]:
    """The project's default reward, chosen by ``data_source``.

    GSM8K: strict (answer after ``####``), as verl scores it. MATH-style sources: math-verify
    on ``\\boxed{}``. ``exact_match`` and ``choice``: the text scorers of
    :mod:`rl_pipeline.rewards.text_answers`. Anything else: verl's ``default_compute_score``.
    """
    if data_source in GSM8K_SOURCES:
        return strict_gsm8k(data_source, solution_str, ground_truth, extra_info)
    if data_source in MATH_SOURCES:
        return math_verify_score(data_source, solution_str, ground_truth, extra_info)
    if data_source in EXACT_MATCH_SOURCES:
        return exact_match(data_source, solution_str, ground_truth, extra_info)
    if data_source in CHOICE_SOURCES:
        return choice(data_source, solution_str, ground_truth, extra_info)
    if data_source in CODE_TESTS_SOURCES:
        return code_tests(data_source, solution_str, ground_truth, extra_info)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)


# The judge is built from reward.judge (build_reward), not loaded by name: listed so that the
# name checks (parameters, self-test) know it.
BUILTIN = {f.__name__: f for f in (compute_score, strict_gsm8k, flexible_gsm8k, math_verify_score,
                                   gsm8k_format_credit, exact_match, choice, well_formed,
                                   code_tests)}
# Classes: build_reward makes them from reward.judge and reward.regex, never by name.
BUILTIN[JUDGE], BUILTIN[REGEX] = Judge, RegexAnswer
# The parameters check names against BUILTIN_NAMES without importing this module (verl)
assert set(BUILTIN) == set(BUILTIN_NAMES), set(BUILTIN) ^ set(BUILTIN_NAMES)


class RewardFunctionError(UserError, ValueError):
    """The reward function the parameters name cannot be used: no such built-in, no such
    function in its file, or one that takes other arguments; the message says which. (A file
    that fails to import is a ValueError with its traceback, which shows the failing line.)"""


def load_reward_function(path: str | None, name: str = "compute_score",
                         parameter: str = "reward.custom_reward_function") -> RewardFunction:
    """The reward function the spec's ``custom_reward_function`` names.

    Args:
        path: A Python file defining the function, ``pkg://module`` for an importable module
            (verl's convention; a reward file shipped to a Ray cluster's nodes is one), or
            None for a built-in one.
        name: The function's name (built-ins: :data:`BUILTIN`).
        parameter: Where the parameters set ``path`` and ``name``, for the messages
            (``reward.terms[1]`` for a term).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file cannot be imported (its traceback shows where).
        RewardFunctionError: If there is no such function, or it is not one verl's reward
            loop can call: other arguments, a generator or a class (a ValueError too).
    """
    if not path:
        if name in (JUDGE, REGEX):
            raise RewardFunctionError(f"the {name} reward is made from the reward.{name} "
                                      "group: rl_pipeline.rewards.build_reward builds it")
        if name not in BUILTIN:
            raise RewardFunctionError(
                f"{parameter}.name={name!r} is not a built-in reward; built-ins: "
                f"{', '.join(BUILTIN)} (or give a file in .path)")
        return BUILTIN[name]
    if not path.startswith(PKG) and not Path(path).is_file():
        raise FileNotFoundError(f"{parameter}.path={path!r}: no such file")
    try:
        module = _import_reward_module(path)
    except Exception as exc:  # a bug in the user's code: its traceback shows the line
        raise ValueError(f"{parameter}.path={path!r} failed to import: {exc!r}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if inspect.isfunction(v)
                 and v.__module__ == module.__name__]
        raise RewardFunctionError(
            f"{parameter}.name={name!r} is not a function in {path}; functions "
            f"found: {', '.join(found) or 'none'}")
    _check_callable(fn, path, name, parameter)
    return fn


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft overlong punishment (Yu et al., 2025, section 3.4; verl's ``dapo`` reward
    manager): within the last ``buffer_len`` tokens before the length cap the reward falls
    linearly, from 0 at the buffer's start to ``-factor`` at the cap. It needs the response's
    length and the cap in ``extra_info`` (:func:`~rl_pipeline.rewards.form.response_facts`);
    without them, or with ``buffer_len`` 0, it is 0."""

    buffer_len: int = 0
    factor: float = 1.0

    def __call__(self, extra_info: dict | None) -> float:
        info = extra_info or {}
        length, cap = info.get(RESPONSE_LENGTH), info.get(MAX_RESPONSE_LENGTH)
        if not self.buffer_len or length is None or cap is None:
            return 0.0
        exceed = int(length) - (int(cap) - self.buffer_len)
        return min(-exceed / self.buffer_len * self.factor, 0.0)


@dataclass(frozen=True)
class Scored:
    """One sample's reward and its parts."""

    reward: float  # what the trainer optimises: the function's score plus the penalty
    function_score: float  # the reward function's own score (0 when it failed)
    overlong_penalty: float = 0.0
    error: str | None = None  # what the function raised, or returned instead of a score
    timed_out: bool = False  # ran past reward.timeout_s (error says so too)
    extra: dict[str, float] = field(default_factory=dict)  # the parts beyond PARTS (extra_names)
    pred: str | None = None  # a dict result's extracted answer (verl votes on it: maj@N)
    note: str | None = None  # a dict result's remark, e.g. the judge's reply

    def parts(self) -> dict[str, float]:
        """The reward's terms and failure flags, as numbers (:data:`PARTS` then ``extra``)."""
        return {"reward_function": self.function_score,
                "overlong_penalty": self.overlong_penalty,
                "reward_error": float(self.error is not None and not self.timed_out),
                "reward_timeout": float(self.timed_out), **self.extra}


# The names of :meth:`Scored.parts` that every reward has: the per-step metrics and the
# columns of the training rollouts table (rl_pipeline.training_rollouts).
PARTS = ("reward_function", "overlong_penalty", "reward_error", "reward_timeout")


class SafeReward:
    """Calls a reward function within a time limit; a raise or a timeout scores 0 and is
    counted, unless ``strict``. Adds the overlong penalty, when one is set.

    A reward function is user code run on model output, which is arbitrary text: one odd
    response must not end or stall an hours-long run. With ``timeout_s`` the function runs
    in a worker process (:func:`~rl_pipeline.rewards.isolation.call_with_limit`), loaded
    there from ``path`` and ``name``; without, in the calling thread. ``errors`` and
    ``timeouts`` count the failures for the metrics.
    """

    def __init__(self, fn: RewardFunction, strict: bool = False,
                 overlong: OverlongPenalty | None = None, *,
                 source: tuple[str | None, str] | None = None,
                 timeout_s: float | None = None) -> None:
        self.fn = fn
        self.strict = strict
        self.overlong = overlong or OverlongPenalty()
        self.source = source
        self.timeout_s = timeout_s if source is not None else None
        if self.timeout_s is not None:
            from rl_pipeline.rewards.isolation import register

            register(*source)  # its workers import the file before their first sample
        self.errors = 0
        self.timeouts = 0
        self._count = threading.Lock()  # score_batch's threads count together
        # Samples scored at once by score_batch: a judge's requests in flight; in worker
        # processes, as many as the pool has (TRL's step and eval scored one at a time,
        # so a step's 64 sandboxed programs ran one after another beside idle workers); else one.
        self.concurrency = int(getattr(fn, "concurrency", 1))
        if self.timeout_s is not None:
            from rl_pipeline.rewards.isolation import workers

            self.concurrency = max(self.concurrency, workers())

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None) -> float:
        return self.score(data_source, solution_str, ground_truth, extra_info).reward

    def score(self, data_source: str, solution_str: str, ground_truth: str,
              extra_info: dict | None = None) -> Scored:
        """The reward of one response, with its parts."""
        from rl_pipeline.rewards.isolation import RewardTimeout, call_with_limit, run

        args = (data_source, solution_str, ground_truth, extra_info)
        penalty = self.overlong(extra_info)
        try:
            if self.timeout_s is None:
                result = run(self.fn, args)
            else:
                result = call_with_limit(*self.source, args, self.timeout_s)
            value = score_of(result)
        # SystemExit too: a reward's sys.exit() must not end the trainer (KeyboardInterrupt,
        # the user's Ctrl-C, still does)
        except (Exception, SystemExit) as exc:
            if self.strict:
                raise
            timed_out = isinstance(exc, RewardTimeout)
            with self._count:
                self.timeouts += timed_out
                self.errors += not timed_out
                told = self.errors + self.timeouts <= 3
            what = failure(exc)
            if told:
                logger.warning("reward function %s %s; scoring 0 (reward.strict=true makes "
                               "this fatal)", getattr(self.fn, "__name__", self.fn),
                               exc if timed_out else f"raised {what}")
            return Scored(penalty, 0.0, penalty, what[:300], timed_out,
                          dict.fromkeys(self.extra_names, 0.0))
        pred = note = None
        if isinstance(result, dict):
            pred = None if result.get("pred") is None else str(result["pred"])
            note = None if result.get("note") is None else str(result["note"])
        extra = {name: _finite(result.get(name)) if isinstance(result, dict) else 0.0
                 for name in self.extra_names}
        return Scored(value + penalty, value, penalty, extra=extra, pred=pred, note=note)

    @property
    def extra_names(self) -> tuple[str, ...]:
        """The parts a sample carries beyond :data:`PARTS`, the same on every sample, failed
        ones included: verl builds its per-sample table from the first sample's keys and
        raises KeyError on a later sample without one. Only the judge has any (its
        :data:`~rl_pipeline.rewards.judge.PARTS`); other keys of a dict result are not
        logged (a user function's keys are unknown until it returns, and a failed sample
        returns none)."""
        return JUDGE_PARTS if isinstance(self.fn, Judge) else ()

    def score_batch(self, samples: Sequence[Sample]) -> list[Scored]:
        """:meth:`score` of each sample, in order; ``concurrency`` at once (a judge's
        requests overlap; a reward in worker processes keeps each of its pool's workers busy;
        one in this thread scores one by one)."""
        return score_concurrently(self.score, samples, self.concurrency)


def score_of(result: Any) -> float:
    """The score a reward function returned: a number, or a dict's ``score``.

    Raises:
        NotAScore: A dict without ``score``, text (``'1.0'`` is not read as a number: a
            function that returns text returns something other than it means to), or a
            value that is not a finite number.
    """
    value = result.get("score", _MISSING) if isinstance(result, dict) else result
    if value is _MISSING:
        raise NotAScore(f"returned a dict without 'score' (its keys: "
                        f"{sorted(map(str, result))})")
    if isinstance(value, str | bytes) or not (isinstance(value, numbers.Real)
                                              or hasattr(value, "__float__")):
        raise NotAScore(f"returned {type(value).__name__} {str(value)[:40]!r}, not a number")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:  # an array of several numbers
        raise NotAScore(f"returned {type(value).__name__}, not one number: {exc}") from None
    if not math.isfinite(number):
        raise NotAScore(f"returned a score of {number}")
    return number


def failure(exc: BaseException) -> str:
    """What went wrong in a reward, in one line: ``Type: message``, and the line that raised
    where it is the reward's own."""
    from rl_pipeline.rewards.isolation import RewardRaised, RewardTimeout, describe

    if isinstance(exc, RewardRaised):  # from a worker: described there
        return str(exc)
    if isinstance(exc, RewardTimeout | NotAScore):  # ours: the line would say nothing
        return f"{type(exc).__name__}: {exc}"
    return describe(exc)


class NotAScore(ValueError):
    """A reward function returned something other than a finite number (or a dict with one
    as ``score``)."""


_MISSING = object()


def _finite(value: Any) -> float:
    """A dict result's part as a number; 0.0 for one that is missing or not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


TERM = "term_"  # the prefix of a weighted term's part (its metric): term_<label>
JUDGE_PART = "judge_"  # the prefix of the judge's parts (rl_pipeline.rewards.judge.PARTS)


def score_concurrently(score: Callable[..., T], jobs: Sequence[Sequence[Any]],
                       concurrency: int) -> list[T]:
    """``score(*job)`` for each job, in order, at most ``concurrency`` at a time (threads: a
    judge's requests wait on the network, a rule's release the GIL in its regex or parser)."""
    if concurrency <= 1 or len(jobs) <= 1:
        return [score(*job) for job in jobs]
    with ThreadPoolExecutor(min(concurrency, len(jobs))) as pool:
        return list(pool.map(lambda job: score(*job), jobs))


class WeightedReward:
    """A reward of weighted terms (``reward.terms``): each term a :class:`SafeReward` of its
    own (contained: its time limit, a raise scoring that term 0 and counted), the reward
    their weighted sum plus the overlong penalty. Each term's score is a part,
    ``term_<label>``, so both trainers log it per step and eval per model. Called as a
    :class:`SafeReward` is."""

    def __init__(self, terms: list[tuple[str, float, SafeReward]],
                 overlong: OverlongPenalty | None = None) -> None:
        self.terms = terms
        self.overlong = overlong or OverlongPenalty()
        self.concurrency = max(t.concurrency for _, _, t in terms)

    @property
    def errors(self) -> int:
        return sum(t.errors for _, _, t in self.terms)

    @property
    def timeouts(self) -> int:
        return sum(t.timeouts for _, _, t in self.terms)

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None) -> float:
        return self.score(data_source, solution_str, ground_truth, extra_info).reward

    def score(self, data_source: str, solution_str: str, ground_truth: str,
              extra_info: dict | None = None) -> Scored:
        """The reward of one response: the weighted sum, each term a part."""
        total, parts, failed, pred, note = 0.0, {}, [], None, None
        for label, weight, term in self.terms:
            scored = term.score(data_source, solution_str, ground_truth, extra_info)
            total += weight * scored.function_score
            parts[f"{TERM}{label}"] = scored.function_score
            # A judge term's costs and failures, to be logged as the judge alone logs them
            parts.update({k: v for k, v in scored.extra.items() if k.startswith(JUDGE_PART)})
            if scored.error is not None:
                failed.append((label, scored))
            pred = pred if pred is not None else scored.pred
            note = note if note is not None else scored.note
        penalty = self.overlong(extra_info)
        error = "; ".join(f"{label}: {s.error}" for label, s in failed) or None
        timed_out = bool(failed) and all(s.timed_out for _, s in failed)
        return Scored(total + penalty, total, penalty, error, timed_out, parts, pred, note)

    def score_batch(self, samples: Sequence[Sample]) -> list[Scored]:
        """:meth:`score` of each sample, in order, ``concurrency`` at once."""
        return score_concurrently(self.score, samples, self.concurrency)


Reward = SafeReward | WeightedReward  # what build_reward gives every caller


def build_reward(reward: RewardParams, strict: bool | None = None) -> Reward:
    """The ``reward`` group's function as both trainers and eval call it: loaded, contained
    (:class:`SafeReward`: its time limit, errors counted) and with its overlong penalty; a
    :class:`WeightedReward` when the group has ``terms``.

    Args:
        reward: The ``reward`` group.
        strict: Overrides ``reward.strict`` (preflights raise, to name a broken reward).
    """
    strict = reward.strict if strict is None else strict
    overlong = OverlongPenalty(reward.overlong_buffer_len, reward.overlong_penalty_factor)

    def contained(path: str | None, name: str, parameter: str,
                  penalty: OverlongPenalty | None = None) -> SafeReward:
        if name == JUDGE and not path:
            # In this thread: the judge's own request timeout and retries bound it, and a
            # worker process per request would lose the client, its connections and cache.
            return SafeReward(Judge(reward.judge), strict, penalty)
        if name == REGEX and not path:  # in this thread: the regex package's own time limit
            return SafeReward(RegexAnswer(reward.regex.pattern, reward.timeout_s), strict,
                              penalty)
        return SafeReward(load_reward_function(path, name, parameter), strict, penalty,
                          source=(path, name), timeout_s=reward.timeout_s)

    if reward.terms:
        return WeightedReward([(t.metric, t.weight, contained(t.path, t.name,
                                                              f"reward.terms[{i}]"))
                               for i, t in enumerate(reward.terms)], overlong)
    fn = reward.custom_reward_function
    return contained(fn.path, fn.name, "reward.custom_reward_function", overlong)


async def verl_reward(data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None, *, reward: str = "{}",
                      **_: Any) -> dict[str, float]:
    """The reward as verl's reward loop calls it (``reward.custom_reward_function``).

    verl passes ``custom_reward_function.reward_kwargs`` as keyword arguments; ours hold one,
    ``reward``: the whole ``reward`` group as JSON
    (:func:`rl_pipeline.engines.verl.config.reward_overrides`). It is rebuilt once per worker
    by :func:`build_reward`, the road eval and the trl engine take, so the verl engine scores
    exactly as they do, with no second set of defaults. ``extra_info`` carries the
    response's length and truncation
    (:class:`~rl_pipeline.engines.verl.reward_manager.ResponseFactsRewardManager`). Other
    keyword arguments verl adds (a reward-model router) are not used.

    It is a coroutine: verl's reward loop awaits it for all of a batch's samples at once, and
    it scores on a thread pool of the reward's own ``concurrency`` (a judge's requests in
    flight, a worker pool's workers; :func:`os.cpu_count` threads otherwise).

    Returns:
        ``score`` (the reward) and the reward's parts (:meth:`Scored.parts`), which verl
        keeps per sample as ``reward_extra_info``: the trainer logs them per step.
    """
    scorer = _reward_from_json(reward)
    scored = await asyncio.get_running_loop().run_in_executor(
        _pool(reward), scorer.score, data_source, solution_str, ground_truth, extra_info)
    return {"score": scored.reward, **scored.parts()}


def prepare_verl_reward(reward: str, reward_workers: int) -> None:
    """Build the reward :func:`verl_reward` scores with (``reward``: its ``reward`` keyword,
    the group as JSON) ahead of its first sample, and start its scorer processes
    (:func:`~rl_pipeline.rewards.isolation.warm`), this worker's share of the cores
    among ``reward_workers``, while verl's workers still load.

    verl's reward manager calls this when it is built, where verl has several reward
    workers: it sends each sample to one picked at random, so a worker's first sample, and
    the start of its pool, could fall in step 2 and hold up that step's whole rollout.
    """
    from rl_pipeline.rewards.isolation import share_cores, warm

    scorer = _reward_from_json(reward)
    terms = [t for _, _, t in scorer.terms] if isinstance(scorer, WeightedReward) else [scorer]
    if any(term.timeout_s is not None for term in terms):
        share_cores(reward_workers)
        warm()


@functools.cache
def _pool(text: str) -> ThreadPoolExecutor:
    scorer = _reward_from_json(text)
    workers = scorer.concurrency if scorer.concurrency > 1 else min(32, (os.cpu_count() or 1) + 4)
    return ThreadPoolExecutor(workers, thread_name_prefix="rl_pipeline-reward")


@functools.cache
def _reward_from_json(text: str) -> Reward:
    from rl_pipeline.params import RewardParams

    return build_reward(RewardParams.model_validate_json(text))


@functools.cache
def load_reward_function_cached(path: str | None, name: str) -> RewardFunction:
    """:func:`load_reward_function`, once per process (a worker scores many samples)."""
    return load_reward_function(path, name)


def _import_reward_module(path: str) -> Any:
    if path.startswith(PKG):
        return importlib.import_module(path[len(PKG):])
    file = Path(path).resolve()
    # Registered by a name of its own file, so that what crosses from a scorer process to
    # its caller by pickle (an exception or a value of a class the file defines) finds its
    # module on both sides; two files of one stem get two names.
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", file.stem)
    name = f"custom_reward_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _same_number(answer: str, truth: str) -> bool:
    try:
        return float(answer.replace(",", "")) == float(truth.replace(",", ""))
    except ValueError:
        return answer == truth


def _check_callable(fn: Callable, path: str, name: str, parameter: str) -> None:
    """Refuse what verl's reward loop could not call as a reward: another signature, a class
    (calling it makes an object, not a score), a generator (it yields, never returns). An
    ``async def`` function is awaited (:func:`rl_pipeline.rewards.isolation.run`)."""
    where = f"{parameter}.name={name!r} in {path}"
    if inspect.isclass(fn):
        raise RewardFunctionError(f"{where} is a class; give a function (or an object whose "
                                  "__call__ scores)")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise RewardFunctionError(f"{where} is a generator (it yields); a reward returns its "
                                  "score")
    try:
        inspect.signature(fn).bind("source", "solution", "truth", None)
    except TypeError as exc:
        raise RewardFunctionError(
            f"{where} must accept (data_source, solution_str, ground_truth, "
            f"extra_info=None): {exc}") from None
