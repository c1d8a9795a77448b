"""Scorers for answers that are text, not numbers: exact match and a choice among options.

Both read the response's *final answer* (:func:`final_answer`): what follows the last
``####``, ``answer:`` or ``\\boxed{}``, else the last non-empty line. So a response may reason
first, as GSM8K's do, and the data's ground truth is only the answer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

_MARKER = re.compile(r"####|\banswer\s*(?:is)?\s*:|\banswer\s+is\b", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_LETTER = re.compile(r"(?<![A-Za-z])(?:\(([A-Za-z])\)|([A-Z]))(?![A-Za-z])")
# After an answer marker, a lone letter of either case: "Answer: b", "b)", "b. Paris"; not
# "a dog" (an article), nor "i.e. B" or "e.g. (C)" (a point must end the letter's word)
_LEADING_LETTER = re.compile(r"\(?([A-Za-z])(?:\)|[.:,](?=\s|$)|\s*$)")


def final_answer(response: str) -> str:
    """The response's final answer, on one line, without a trailing full stop: the first
    line after the last ``####`` or ``answer:``/``answer is`` marker, else the last
    ``\\boxed{}``'s content, else the last non-empty line."""
    return _final_answer(response)[0]


def _final_answer(response: str) -> tuple[str, bool]:
    """:func:`final_answer`, and whether a marker or ``\\boxed{}`` introduced it (its
    start is then the answer; a last line's end is)."""
    markers = list(_MARKER.finditer(response))
    marked = True
    if markers:
        lines = response[markers[-1].end():].strip().splitlines()
        text = lines[0] if lines else ""
    elif boxed := _BOXED.findall(response):
        text = boxed[-1]
    else:
        lines = [line for line in response.splitlines() if line.strip()]
        text, marked = (lines[-1] if lines else ""), False
    return text.strip().rstrip(".").strip(), marked


def normalize_answer(text: str) -> str:
    """Unicode NFKC, case-folded, punctuation removed (every Unicode P* character) except
    what a number holds (a minus sign, ``.`` before a digit where it starts a number or
    follows one, ``/`` or ``:`` between digits), whitespace collapsed: "The  Eiffel-Tower!"
    and "the eiffeltower" are the same, "-5" and "5", "3.5" and "35", or ".5" and "5", are
    not."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join("".join(c for i, c in enumerate(text)
                            if not unicodedata.category(c).startswith("P")
                            or _in_number(text, i)).split())


def _in_number(text: str, i: int) -> bool:
    after = text[i + 1:i + 2].isdigit()
    before = text[i - 1:i]
    if text[i] == "-":  # -5, -.5
        return after or (text[i + 1:i + 2] == "." and text[i + 2:i + 3].isdigit())
    if text[i] == ".":  # 3.5, and .5 or -.5 (a number's start), not v.2
        return after and (before.isdigit() or before in ("", "-") or before.isspace())
    return text[i] in "/:" and after and before.isdigit()


def _truths(ground_truth: str | Sequence[str] | None) -> list[str]:
    """One acceptable answer, or several (a list in the data); a number as its text, and
    none for a missing one (it raised on every sample, each scored 0 as an error)."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, str) or not isinstance(ground_truth, Sequence):
        return [str(ground_truth)]
    return [str(t) for t in ground_truth]


def exact_match(data_source: str, solution_str: str, ground_truth: str | Sequence[str],
                extra_info: dict | None = None) -> float:
    """1.0 when the final answer equals the ground truth (or one of a list of them) after
    :func:`normalize_answer`."""
    answer = normalize_answer(final_answer(solution_str))
    return 1.0 if answer and any(answer == normalize_answer(t)
                                 for t in _truths(ground_truth)) else 0.0


def chosen_option(response: str) -> str | None:
    """The option letter the final answer picks: a standalone capital letter, or letter in
    parentheses, ("B", "(b)", "B)", "B. Paris"), upper-cased; None when there is none. After
    an answer marker the first (``Answer: B, as I said``: B, not the I), a lone lower-case
    letter included (``Answer: b``, ``b) Paris``; not the article of ``a dog``); on a last
    line without one the last (``I think it is B``)."""
    text, marked = _final_answer(response)
    if marked and (lone := _LEADING_LETTER.match(text)):
        return lone.group(1).upper()
    found = _LETTER.findall(text)
    if not found:
        return None
    paren, bare = found[0] if marked else found[-1]
    return (paren or bare).upper()


def choice(data_source: str, solution_str: str, ground_truth: str | Sequence[str],
           extra_info: dict | None = None) -> float:
    """A choice among options. A ground truth that is one letter (A-Z, either case) is
    compared with the letter the final answer picks (:func:`chosen_option`); a label
    ("positive", "spam", "Б") with the final answer as :func:`exact_match` compares it."""
    truths = _truths(ground_truth)
    if all(len(t.strip()) == 1 and t.strip().isascii() and t.strip().isalpha()
           for t in truths):
        picked = chosen_option(solution_str)
        return 1.0 if picked is not None and picked in {t.strip().upper() for t in truths} \
            else 0.0
    return exact_match(data_source, solution_str, ground_truth, extra_info)


class RegexAnswer:
    """The ``regex`` reward: the user's pattern (``reward.regex.pattern``) finds the answer in
    the response; its last match's ``answer`` group (or first group) equal to the ground
    truth after :func:`normalize_answer` scores 1.0. Built from ``reward.regex`` by
    :func:`rl_pipeline.rewards.build_reward`; the parameters checked that the pattern reads
    ``reward.regex.example``, which the reward self-test writes its ideal responses in.

    The pattern runs on the ``regex`` package, Python's syntax with a time limit: a pattern
    that backtracks without end on some response (``(a|aa)+$``) raises ``TimeoutError``
    after ``timeout_s`` (``reward.timeout_s``), which scores that sample 0 and is counted,
    where ``re`` would stall the run.
    """

    __name__ = "regex"

    def __init__(self, pattern: str, timeout_s: float | None = None) -> None:
        import regex

        self.pattern = regex.compile(pattern, regex.MULTILINE)
        self.timeout_s = timeout_s

    def answer(self, response: str) -> str | None:
        """The last match's answer, or None when the pattern finds none."""
        matches = list(self.pattern.finditer(response, timeout=self.timeout_s))
        if not matches:
            return None
        last = matches[-1]
        return last.group("answer") if "answer" in self.pattern.groupindex else last.group(1)

    def __call__(self, data_source: str, solution_str: str, ground_truth: str | Sequence[str],
                 extra_info: dict | None = None) -> dict:
        found = self.answer(solution_str)
        right = found is not None and normalize_answer(found) != "" and any(
            normalize_answer(found) == normalize_answer(t) for t in _truths(ground_truth))
        return {"score": 1.0 if right else 0.0, "pred": found}
