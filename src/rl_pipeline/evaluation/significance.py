"""Is a base-versus-trained difference real? A paired bootstrap over prompts.

Both models answer the same prompts, and prompts differ far more in difficulty than the
models do, so the comparison is paired: each resample draws prompts with replacement and
takes the mean of the per-prompt differences (trained - base), the same draws for both
models. The 95% interval is the 2.5th to 97.5th percentile of those means (percentile
bootstrap, ``scipy.stats.bootstrap``). A seeded generator makes it reproducible, and the
same seed gives the same resampled prompts to every metric with the same prompts.

The percentile interval alone is too narrow when few prompts changed: with 4 prompts of any
number better and none worse, fewer than 2.5% of resamples miss all four, so it excludes 0,
where an exact test of those 4 signs gives p = 0.125. A difference is therefore beyond noise
(``distinguishable``) only when the interval excludes 0 and the exact sign test of the
prompts that changed agrees (McNemar's exact test, for 0/1 scores): at least 6 changed
prompts, all one way, or more with a clear majority.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

CONFIDENCE = 0.95
Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # 1.96
_CELLS = 4_000_000  # resampled values held at once (32 MB of float64)


def _bootstrap(values: np.ndarray, resamples: int, seed: int) -> Any:
    """scipy's bootstrap of the mean, percentile method, in batches of bounded memory.

    Percentile, not BCa: per-prompt differences of 0/1 scores are often all equal (a model
    that changed nothing: every difference 0), and BCa's acceleration is then undefined:
    scipy returns NaN with a DegenerateDataWarning, where the percentile interval is [0, 0].
    """
    from scipy import stats

    return stats.bootstrap((values,), np.mean, n_resamples=resamples, method="percentile",
                           confidence_level=CONFIDENCE, rng=np.random.default_rng(seed),
                           batch=max(1, _CELLS // len(values)), vectorized=True)


def resampled_means(values: np.ndarray, resamples: int = 10_000, seed: int = 42) -> np.ndarray:
    """Means of ``resamples`` bootstrap resamples of ``values`` (one per prompt).

    Args:
        values: One value per prompt (at least two).
        resamples: How many resamples.
        seed: Seeds the generator; equal seeds and lengths resample the same prompts, so the
            resampled means of two models' scores differ by those of their differences.

    Returns:
        ``(resamples,)``: each resample's mean (scipy's bootstrap distribution).
    """
    values = _checked(values)
    if len(values) < 2:
        raise ValueError("resampling needs at least two prompts")
    return _bootstrap(values, resamples, seed).bootstrap_distribution


def bootstrap_interval(values: np.ndarray, resamples: int = 10_000,
                       seed: int = 42) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of ``values`` (one per prompt;
    one prompt: its value, both ends, as resampling it could give nothing else)."""
    values = _checked(values)
    if len(values) == 1:
        return float(values[0]), float(values[0])
    interval = _bootstrap(values, resamples, seed).confidence_interval
    return float(interval.low), float(interval.high)


def _checked(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        raise ValueError("a bootstrap needs at least one prompt")
    return values


def paired_comparison(base: np.ndarray, trained: np.ndarray, resamples: int = 10_000,
                      seed: int = 42) -> dict[str, Any]:
    """The difference trained - base of a per-prompt score, with its paired 95% interval.

    Args:
        base, trained: The score of each prompt (same prompts, same order).
        resamples, seed: See :func:`resampled_means`.

    Returns:
        ``delta`` (mean difference), ``ci_low`` and ``ci_high`` (its 95% interval),
        ``prompts_up`` and ``prompts_down`` (the prompts that scored higher / lower),
        ``p_sign`` (:func:`sign_test` of those), ``distinguishable`` (over two prompts or
        more, the interval excludes 0 and the sign test agrees at the 5% level),
        ``sd_diff`` (the standard deviation of the per-prompt differences), ``prompts``,
        ``prompts_needed`` and ``prompts_needed_80`` (see :func:`prompts_needed`).
    """
    base, trained = np.asarray(base, dtype=float), np.asarray(trained, dtype=float)
    if base.shape != trained.shape or base.ndim != 1:
        raise ValueError(f"paired scores need one value per prompt for both models; got "
                         f"shapes {base.shape} and {trained.shape}")
    diff = trained - base
    low, high = bootstrap_interval(diff, resamples, seed)
    delta = float(diff.mean())
    sd = float(diff.std(ddof=1)) if len(diff) > 1 else math.nan
    up, down = int((diff > _ZERO).sum()), int((diff < -_ZERO).sum())
    p_sign = sign_test(up, down)
    agrees = p_sign < 1 - CONFIDENCE and ((low > 0 and up > down) or (high < 0 and down > up))
    # One prompt's difference is its own interval, and no evidence of anything.
    return {"delta": delta, "ci_low": low, "ci_high": high,
            "distinguishable": bool(len(diff) > 1 and (low > 0 or high < 0) and agrees),
            "prompts_up": up, "prompts_down": down, "p_sign": p_sign, "sd_diff": sd,
            "prompts": len(diff), "prompts_needed": prompts_needed(delta, sd),
            "prompts_needed_80": prompts_needed(delta, sd, power=0.8)}


_ZERO = 1e-12  # a difference of two equal scores computed apart (rewards summed in parts)


def sign_test(up: int, down: int) -> float:
    """The two-sided exact sign test of ``up`` prompts better against ``down`` worse (the
    unchanged ones carry no evidence either way): McNemar's exact test for 0/1 scores; 1.0
    when none changed."""
    if up + down == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(up, up + down, 0.5).pvalue)


def prompts_needed(delta: float, sd_diff: float, power: float = 0.5) -> int | None:
    """Roughly how many prompts a paired comparison needs to detect a difference ``delta``.

    From the normal approximation of the mean difference, whose standard error is
    ``sd_diff / sqrt(n)``: with ``n = (1.96 * sd_diff / |delta|)**2`` the expected 95%
    interval just reaches 0, so a true difference of this size is detected about half the
    time (``power=0.5``); ``power=0.8`` adds ``z_0.8 = 0.84`` to 1.96, about twice the
    prompts. It assumes the per-prompt differences of a larger eval spread as these do.

    Returns:
        The number of prompts (at least 1), or None when there is no difference (or too
        few prompts to estimate the spread).
    """
    if abs(delta) < 1e-12 or math.isnan(sd_diff):  # a mean of floats is rarely exactly 0
        return None
    z = Z + NormalDist().inv_cdf(power)
    return max(1, math.ceil((z * sd_diff / abs(delta)) ** 2))


def signs_disagree(c: dict[str, Any]) -> str:
    """Why a comparison whose interval excludes 0 is not beyond noise, from its sign test."""
    up, down, p = c.get("prompts_up"), c.get("prompts_down"), c.get("p_sign")
    if up is None or down is None or p is None:
        return "its sign test did not agree"
    counts = (f"{up} prompt(s) scored higher and {down} lower (exact sign test p = "
              f"{p:.2g})")
    if p < 1 - CONFIDENCE:  # significant the other way: the mean is carried by a few prompts
        return f"{counts}: most changed prompts went the other way"
    return f"{counts}: too few changed to tell from noise"
