"""A few prompts, base and trained answers side by side, chosen to show what changed.

A reviewer should read what the model says before trusting a number. The examples are the
first sample of prompts picked in this order, each kind at most :data:`PER_KIND`: answers
that turned **degenerate** (repetitive, truncated or without reasoning where the base's was
not), prompts the trained model **gained** (base wrong, trained right), prompts it **lost**
(base right, trained wrong), then **unchanged** ones to fill :data:`EXAMPLES`. "Right" is
strict or flexible on GSM8K-style sources, reward at least ``reward.correct_score``
elsewhere; each answer says by which.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from rl_pipeline.evaluation.metrics import correctness_score

EXAMPLES = 6
PER_KIND = 2
_TEXT_LIMIT = 600  # characters of a response shown; the generations table has all of it
_KINDS = ("degenerate", "gained", "lost", "unchanged")
_MARKUP = re.compile(r"^(\s*[#>*+-])")


def pick_examples(base: pd.DataFrame, trained: pd.DataFrame,
                  correct_score: float) -> list[dict[str, Any]]:
    """Examples from two models' scored generations on the same prompts.

    Returns:
        Up to :data:`EXAMPLES` dicts: ``kind``, ``prompt_index``, ``data_source``, ``prompt``,
        ``ground_truth``, and per model (``base_``, ``trained_``) ``response``, ``reward``,
        ``right`` and ``flags`` (repetitive, truncated, no reasoning).
    """
    first = ["prompt_index", "sample_index"]
    pairs = base.sort_values(first).groupby("prompt_index").head(1).merge(
        trained.sort_values(first).groupby("prompt_index").head(1),
        on="prompt_index", suffixes=("_base", "_trained"))
    chosen: dict[str, list[dict[str, Any]]] = {kind: [] for kind in _KINDS}
    for _, row in pairs.iterrows():
        example = {"prompt_index": int(row["prompt_index"]),
                   "data_source": row["data_source_base"], "prompt": row["prompt_base"],
                   "ground_truth": row["ground_truth_base"]}
        for label in ("base", "trained"):
            example[f"{label}_response"] = row[f"response_{label}"]
            example[f"{label}_reward"] = float(row[f"reward_{label}"])
            example[f"{label}_right"] = _right(row, label, correct_score)
            example[f"{label}_judged"] = _judged(row, label, correct_score)
            example[f"{label}_flags"] = _flags(row, label)
        kind = _kind(example)
        example["kind"] = kind
        chosen[kind].append(example)
    picked = [e for kind in _KINDS[:-1] for e in chosen[kind][:PER_KIND]]
    return picked + chosen["unchanged"][:max(0, EXAMPLES - len(picked))]


def examples_markdown(examples: list[dict[str, Any]]) -> list[str]:
    """The examples as Markdown that wraps: no wide table, each answer a quoted block."""
    if not examples:
        return ["No examples: no trained model."]
    titles = {"degenerate": "the trained answer degenerated",
              "gained": "gained: base wrong, trained right",
              "lost": "lost: base right, trained wrong",
              "unchanged": "unchanged"}
    lines = []
    for i, e in enumerate(examples, 1):
        lines += [f"### {i}. Prompt {e['prompt_index']} ({e['data_source']}): "
                  f"{titles[e['kind']]}", "",
                  f"**Prompt:** {_one_line(e['prompt'])}", "",
                  f"**Ground truth:** {e['ground_truth']}", ""]
        for label in ("base", "trained"):
            verdict = e.get(f"{label}_judged") or ("right" if e[f"{label}_right"] else "wrong")
            flags = ", ".join(e[f"{label}_flags"])
            lines += [f"**{label.capitalize()}** (reward {e[f'{label}_reward']:.3g}, {verdict}"
                      f"{'; ' + flags if flags else ''}):", "",
                      *_quoted(e[f"{label}_response"]), ""]
    return lines


def _right(row: pd.Series, label: str, correct_score: float) -> bool:
    strict, flexible = row[f"strict_{label}"], row[f"flexible_{label}"]
    if pd.notna(strict):
        return bool(strict or flexible)
    return bool(correctness_score(row, f"_{label}") >= correct_score)


def _judged(row: pd.Series, label: str, correct_score: float) -> str:
    """Right or wrong in words that say by which measure: a reward of 0 beside "right" (the
    last number right, not in the "####" form) read as a contradiction."""
    strict, flexible = row[f"strict_{label}"], row[f"flexible_{label}"]
    if pd.isna(strict):
        return (f"right: reward at least {correct_score:g}"
                if correctness_score(row, f"_{label}") >= correct_score else "wrong")
    if strict:
        return "right: the #### answer"
    return "right by its last number only (flexible), not as a #### answer" if flexible \
        else "wrong"


def _flags(row: pd.Series, label: str) -> list[str]:
    names = {"repetitive": "repetitive", "truncated": "truncated",
             "no_reasoning": "no reasoning"}
    return [name for column, name in names.items() if bool(row[f"{column}_{label}"])]


def _kind(e: dict[str, Any]) -> str:
    if set(e["trained_flags"]) - set(e["base_flags"]):
        return "degenerate"
    if e["trained_right"] != e["base_right"]:
        return "gained" if e["trained_right"] else "lost"
    return "unchanged"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _quoted(text: str) -> list[str]:
    text = str(text)
    if len(text) > _TEXT_LIMIT:
        text = text[:_TEXT_LIMIT] + f" … ({len(text) - _TEXT_LIMIT} more characters)"
    # Quoted lines wrap in any Markdown viewer (a code block would scroll); a leading "#"
    # (GSM8K's "#### 18") is escaped so that it does not render as a heading.
    return ["> " + _MARKUP.sub(r"\\\1", line) if line.strip() else ">"
            for line in (text.splitlines() or [""])]
