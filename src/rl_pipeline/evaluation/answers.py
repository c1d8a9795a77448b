"""The answer a response gives, as a vote for majority voting (maj@k).

Two responses vote together when their extracted answers are equal strings, so extraction
normalises what does not change the answer (commas, a trailing period, LaTeX spacing).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed, strip_string

from rl_pipeline.evaluation.gsm8k import (
    STRICT_PATTERN,
    flexible_extract,
    is_gsm8k_source,
    normalise,
    strict_match,
)

_SPACE = re.compile(r"\s+")


def extract_answer(data_source: str, response: str, pred: str | None = None) -> str | None:
    """The answer ``response`` gives, or None when it gives none (it then does not vote).

    Args:
        data_source: The row's data source.
        response: The model's response.
        pred: The answer the reward function reported (a dict result's ``pred``, verl's
            convention for its own maj@N); it wins when given, as the reward knows its format.

    Returns:
        GSM8K sources: the strict-match answer, else the flexible-extract one (lm-eval's
        normalisation); None for a response with several different ``####`` answers.
        Other sources: the last ``\\boxed{}`` (verl's MATH normalisation),
        else, on non-GSM8K sources, the whole response with whitespace collapsed, so that
        short free-text answers (a custom reward's) still vote.
    """
    if pred is not None:
        return str(pred).strip()
    if is_gsm8k_source(data_source):
        # A hedge ("#### 5 ... #### 7") does not vote: strict-match reads its first answer
        # and the reward its last, so its vote for 5 would carry the reward that 7 earned.
        if len({normalise(a.strip()) for a in STRICT_PATTERN.findall(response)}) > 1:
            return None
        return strict_match(response) or flexible_extract(response)
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    text = _SPACE.sub(" ", response).strip()
    return text or None


def last_boxed(response: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox``), normalised as verl's MATH
    scorer compares answers; None when there is none or it is unbalanced."""
    boxed = last_boxed_only_string(response)
    if boxed is None:
        return None
    try:
        inner = remove_boxed(boxed)
    except AssertionError:  # \fbox{...}: remove_boxed knows only \boxed
        inner = boxed[boxed.index("{") + 1:-1] if "{" in boxed else boxed
    try:
        return strip_string(inner)
    except Exception:  # strip_string asserts on some malformed LaTeX; the raw text still votes
        return inner.strip()
