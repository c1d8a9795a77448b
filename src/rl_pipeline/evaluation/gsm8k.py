"""GSM8K's strict and flexible scores, as lm-evaluation-harness's ``gsm8k`` task defines them.

The task (``lm_eval/tasks/gsm8k/gsm8k.yaml``, version 3.0) has two filters and one metric:

- **strict-match**: the first match of ``#### (\\-?[0-9\\.\\,]+)``, the model's answer in
  GSM8K's own format;
- **flexible-extract**: the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, the last number in
  the response, whatever the format;
- **exact_match** of the extracted text with the reference, both after deleting ``,``, ``$``,
  everything up to ``#### `` and one trailing ``.``, case ignored.

So "#### 1,000." is 1000 for both filters, and "The answer is $72." is 72 for flexible-extract.
verl's ``verl.utils.reward_score.gsm8k`` (the strict score that training uses) reads the same
``####`` pattern but differs at the edges, which ``tests/evaluation/test_gsm8k.py`` pins down:
it looks at the last 300 characters only, takes the last ``####`` answer rather than the
first, and its flexible mode compares the raw match, so "72." or "1,000" score 0 there.

Which rows get these scores: :func:`is_gsm8k_source` (by data source, see there).
"""

from __future__ import annotations

import re

from rl_pipeline.rewards.scoring import GSM8K_SOURCES

STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
# exact_match's regexes_to_ignore, applied in this order to the answer and the reference.
IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def is_gsm8k_source(data_source: str) -> bool:
    """Whether rows of ``data_source`` get GSM8K's strict and flexible scores.

    By data source only (``openai/gsm8k``, ``gsm8k``, ``rl_pipeline/arithmetic``:
    :data:`GSM8K_SOURCES`), not by the look of the ground truth: MATH and many custom sets
    have plain-number answers too, but their responses are not asked for ``#### <number>``,
    so a strict score would only measure the prompt format. A GSM8K-style custom set can
    take ``data_prep.data_source: gsm8k``.
    """
    return data_source in GSM8K_SOURCES


def strict_match(response: str) -> str | None:
    """The strict-match answer: the first ``#### <number>``, normalised; None when absent."""
    found = STRICT_PATTERN.findall(response)
    return normalise(found[0].strip()) if found else None


def flexible_extract(response: str) -> str | None:
    """The flexible-extract answer: the last number-like run, normalised; None when absent."""
    found = FLEXIBLE_PATTERN.findall(response)
    if not found:
        return None
    groups = [group for group in found[-1] if group]
    return normalise(groups[0].strip()) if groups else None


def normalise(text: str) -> str:
    """exact_match's view of an answer or a reference (regexes_to_ignore, then lower case)."""
    for pattern in IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def strict_score(response: str, ground_truth: str) -> float:
    """1.0 when the strict-match answer equals the ground truth (exact_match), else 0.0."""
    answer = strict_match(response)
    return float(answer is not None and answer == normalise(str(ground_truth)))


def flexible_score(response: str, ground_truth: str) -> float:
    """1.0 when the flexible-extract answer equals the ground truth (exact_match), else 0.0."""
    answer = flexible_extract(response)
    return float(answer is not None and answer == normalise(str(ground_truth)))
