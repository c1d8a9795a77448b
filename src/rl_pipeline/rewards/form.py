"""What a response looks like, apart from whether it is right: its final answers, whether it
repeats itself, whether it reasons before answering, and whether it ended by itself.

One definition of each, used by the reward (format credit only for a well-formed response)
and by evaluation (the degeneration rates that name reward hacking), so that what the reward
refuses to pay for and what the report calls degenerate are the same thing.

The definitions, on a response's text:

- **final answer** (GSM8K style): a ``#### <number>`` (the pattern of GSM8K's strict score).
  A response *answers once* when it has exactly one.
- **repetitive**: a line of content (not markup such as ``\\[`` or a code fence) occurs
  :data:`MAX_LINE_REPEATS` or more times (``#### 10`` on every line), or at least
  :data:`MAX_NGRAM_REPEAT_SHARE` of its word :data:`NGRAM`-grams repeat an earlier one (a
  loop within a line: ``The answer is 10. The answer is 10. ...``). Measured on GSM8K's
  8,792 reference solutions (train and test): none is repetitive by either rule
  (``tests/rewards/test_form.py``).
- **no reasoning**: the response has an answer (a ``#### <number>``, else a ``\\boxed{}``,
  else a number) and the text before it has fewer than :data:`MIN_REASONING_WORDS` words or
  no number at all (``#### 10`` alone, or ``The answer is #### 10``).
- **ended**: generation stopped at an end-of-sequence token within the length cap, as the
  caller reports it (:data:`TRUNCATED` in ``extra_info``); the text alone cannot tell.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from verl.utils.reward_score.math_reward import last_boxed_only_string

# The keys of ``extra_info`` under which trainers and eval report how a response ended.
RESPONSE_LENGTH = "response_length"  # tokens generated (EOS included when it came)
MAX_RESPONSE_LENGTH = "max_response_length"  # the generation cap in tokens
TRUNCATED = "truncated"  # stopped by the cap, not by an end-of-sequence token

ANSWER = re.compile(r"#### (\-?[0-9][0-9\.\,]*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MAX_LINE_REPEATS = 3
# A line that is only markup: no letter or digit (\[, \], $$, }), a code fence, or a LaTeX
# environment's \begin{...} or \end{...}.
_MARKUP_LINE = re.compile(r"[^\w]*|```\w*|\\(?:begin|end)\{[^}]*\}")
NGRAM = 4
MAX_NGRAM_REPEAT_SHARE = 0.5  # GSM8K reference solutions reach 0.31 (templated steps)
MIN_NGRAMS = 8  # below this many n-grams the share says nothing
MIN_REASONING_WORDS = 3


def response_facts(length: int, cap: int, truncated: bool) -> dict[str, Any]:
    """The ``extra_info`` entries that tell a reward how a response ended."""
    return {RESPONSE_LENGTH: int(length), MAX_RESPONSE_LENGTH: int(cap),
            TRUNCATED: bool(truncated)}


def final_answers(response: str) -> list[str]:
    """Every ``#### <number>`` answer of ``response``, commas removed, in order."""
    return [m.replace(",", "").rstrip(".") for m in ANSWER.findall(response)]


def repeated_line(response: str) -> str | None:
    """A line of content that occurs at least :data:`MAX_LINE_REPEATS` times, or None.
    Markup lines do not count: a MATH solution opens and closes several ``\\[`` display
    blocks, and an answer with code several fences (``` ```python ```)."""
    lines = Counter(line.strip() for line in response.splitlines()
                    if line.strip() and not _MARKUP_LINE.fullmatch(line.strip()))
    line, count = lines.most_common(1)[0] if lines else ("", 0)
    return line if count >= MAX_LINE_REPEATS else None


def ngram_repeat_share(response: str, n: int = NGRAM) -> float:
    """The share of word ``n``-grams that repeat an earlier one (0 with too few to tell)."""
    words = response.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if len(grams) < MIN_NGRAMS:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def is_repetitive(response: str) -> bool:
    """Whether ``response`` repeats itself (see the module's definition)."""
    return (repeated_line(response) is not None
            or ngram_repeat_share(response) >= MAX_NGRAM_REPEAT_SHARE)


def answer_start(response: str) -> int | None:
    """Where the final answer begins: the first ``#### <number>``, else the last
    ``\\boxed{}``, else the last number; None when the response gives no answer."""
    found = ANSWER.search(response)
    if found:
        return found.start()
    boxed = last_boxed_only_string(response)
    if boxed is not None:
        return response.rfind(boxed)
    numbers = list(_NUMBER.finditer(response))
    return numbers[-1].start() if numbers else None


def has_no_reasoning(response: str) -> bool:
    """Whether ``response`` answers without reasoning first (see the module's definition)."""
    start = answer_start(response)
    if start is None:
        return False  # no answer at all: counted as unanswered, not as unreasoned
    before = response[:start]
    return len(before.split()) < MIN_REASONING_WORDS or not _NUMBER.search(before)


@dataclass(frozen=True)
class Form:
    """How a response is formed (:func:`form`)."""

    answers: list[str]
    repetitive: bool
    truncated: bool

    @property
    def answer(self) -> str | None:
        """The one final answer, or None when there is none or more than one."""
        return self.answers[0] if len(self.answers) == 1 else None

    @property
    def well_formed(self) -> bool:
        """Ended by itself, one final answer, not repetitive: what format credit pays for."""
        return self.answer is not None and not self.repetitive and not self.truncated


def form(response: str, extra_info: dict[str, Any] | None = None) -> Form:
    """The form of ``response``; ``extra_info`` says whether it was truncated (when it does
    not, the response is taken to have ended by itself)."""
    truncated = bool((extra_info or {}).get(TRUNCATED, False))
    return Form(final_answers(response), is_repetitive(response), truncated)
