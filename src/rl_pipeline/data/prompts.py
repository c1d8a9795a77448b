"""From raw records to prompts in verl's RLHFDataset schema.

A split moves through data_prep as a *work frame*: one row per record with the
question text (before the instruction is appended), the original answer, the extracted
ground truth, the source line and, for multimodal data, the images. Only the last step
turns it into verl's columns, so truncation can shorten the question alone and leave the
system prompt and the instruction intact.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

import pandas as pd

from rl_pipeline.data.records import BadRecord, RawRecords
from rl_pipeline.errors import UserError
from rl_pipeline.params import DataPrepParams

# verl's examples/data_preprocess/gsm8k.py: the number after "#### ", commas removed.
_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")

WORK_COLUMNS = ["question", "answer", "ground_truth", "origin", "line"]
_SHOWN = 40  # characters of a mistyped value quoted in a bad-record message


class DataError(UserError, ValueError):
    """The input data cannot be turned into prompts; the message says where and why."""


def prompt_fields(params: DataPrepParams) -> list[str]:
    """The record fields the prompt is built from."""
    if params.prompt_template is None:
        return [params.dataset_prompt_column]
    return [name for _, name, _, _ in string.Formatter().parse(params.prompt_template) if name]


def question_text(record: dict[str, Any], params: DataPrepParams) -> str:
    """The question of one record: the prompt column, or the template filled from the record."""
    if params.prompt_template is None:
        return _as_text(record[params.dataset_prompt_column])
    return params.prompt_template.format_map({k: _as_text(v) for k, v in record.items()})


def extract_ground_truth(answer: Any, params: DataPrepParams) -> str | None:
    """The ground truth taken from an answer field, or None when there is none to take."""
    text = _as_text(answer)
    if params.answer_extraction == "gsm8k":
        match = _GSM8K_ANSWER.search(text)
        if match is None or _runs_on(text[match.end():]):
            # "#### 1/2", "#### 1e5": verl's pattern stops at the first other character and
            # would make "1" the ground truth, which GSM8K's scorer then compares as a string.
            return None
        # A full stop ends the sentence, not the number ("#### 72."): "72." would score no
        # response right, as verl's strict scorer compares the strings.
        return match.group(1).replace(",", "").removesuffix(".") or None
    if params.answer_extraction == "regex":
        match = re.search(params.answer_regex or "", text)
        return match.group(1).strip() if match and match.group(1) else None
    return text.strip() or None


def field_type_problems(record: dict[str, Any], params: DataPrepParams) -> list[str]:
    """The fields read as text that hold something else, each as ``field 'question' is int
    (12345), expected a string``; empty when every such field has its type.

    Prompt fields must be strings: a number or a list there is a wrong column mapping or a
    broken export, and writing it into the prompt as ``"12345"`` would hide that. The answer
    may also be an integer (Hugging Face math sets store final answers as int64 columns,
    and ``str`` of an int is exact); not a bool or a float, whose text is not the answer.
    """
    problems = [_type_problem(name, record[name], "a string")
                for name in dict.fromkeys(prompt_fields(params))
                if not isinstance(record[name], str)]
    answer = record[params.answer_column]
    if not (isinstance(answer, str) or (isinstance(answer, int) and not isinstance(answer, bool))):
        problems.append(_type_problem(params.answer_column, answer, "a string or an integer"))
    return problems


def user_content(question: str, params: DataPrepParams) -> str:
    """The user message: the question, then the instruction after one space."""
    return f"{question} {params.instruction}" if params.instruction else question


def chat_messages(question: str, params: DataPrepParams) -> list[dict[str, str]]:
    """The chat messages of one prompt: the system message, the few-shot examples as earlier
    turns, then the question."""
    messages = [{"role": "system", "content": params.system_prompt}] if params.system_prompt else []
    for example in params.few_shot:
        messages += [{"role": "user", "content": user_content(example.question, params)},
                     {"role": "assistant", "content": example.answer}]
    messages.append({"role": "user", "content": user_content(question, params)})
    return messages


def extract_work_frame(
    raw: RawRecords, params: DataPrepParams, image_key: str
) -> tuple[pd.DataFrame, Counter, list[BadRecord], list[BadRecord]]:
    """Map raw records to a work frame by the configured columns.

    Args:
        raw: The records of one input.
        params: The data_prep parameters (columns, template, answer extraction).
        image_key: The column that holds images in multimodal data.

    Returns:
        The work frame, the count of dropped rows by reason, the records that lack a
        field the prompt or answer needs, or hold it as another type than text (bad
        records, handled by ``on_bad_record``), and the rows dropped for an empty prompt
        or no ground truth, each with where it is and why (the report lists them).

    Raises:
        DataError: If the input has no records, or a needed column is in none of them.
    """
    if not raw.records and not raw.bad:
        raise DataError(f"{raw.source}: the input is empty (no records)")
    needed = [*prompt_fields(params), params.answer_column]
    _check_columns(raw, needed, params)
    has_images = any(image_key in r for r in raw.records)

    rows: list[dict[str, Any]] = []
    dropped: Counter = Counter()
    bad: list[BadRecord] = []
    filtered: list[BadRecord] = []
    for record, line in zip(raw.records, raw.lines, strict=True):
        missing = [c for c in needed if c not in record]
        if missing:
            bad.append(BadRecord(raw.source, line, f"missing field(s) {', '.join(missing)}; "
                                 f"fields found: {', '.join(sorted(record))}", raw.unit))
            continue
        mistyped = field_type_problems(record, params)
        if has_images and not isinstance(record.get(image_key), list | None):
            # One such value fails the whole parquet file's save, after the other split's.
            mistyped.append(_type_problem(image_key, record[image_key], "a list of images "
                                          "(or null), as verl's multimodal data holds them"))
        if mistyped:
            bad.append(BadRecord(raw.source, line, "; ".join(mistyped), raw.unit))
            continue
        question = question_text(record, params).strip()
        if not question:
            dropped["empty_prompt"] += 1
            filtered.append(BadRecord(raw.source, line, "empty_prompt: field(s) "
                                      f"{', '.join(prompt_fields(params))} hold no text",
                                      raw.unit))
            continue
        truth = extract_ground_truth(record[params.answer_column], params)
        if truth is None:
            dropped["no_ground_truth"] += 1
            filtered.append(BadRecord(raw.source, line, no_ground_truth(
                record[params.answer_column], params), raw.unit))
            continue
        row = {"question": question, "answer": _as_text(record[params.answer_column]),
               "ground_truth": truth, "origin": raw.origin, "line": line}
        if has_images:
            row[image_key] = record.get(image_key)
        rows.append(row)
    columns = WORK_COLUMNS + ([image_key] if has_images else [])
    return pd.DataFrame(rows, columns=columns), dropped, bad, filtered


def _runs_on(rest: str) -> bool:
    """Whether the text after a ``#### <number>`` match goes on as part of the answer (the
    number is then not all of it) rather than ending it."""
    return bool(rest) and not rest[0].isspace()


def no_ground_truth(answer: Any, params: DataPrepParams) -> str:
    """Why :func:`extract_ground_truth` found nothing in ``answer``, naming the field and
    what the extraction expects."""
    expected = {"gsm8k": "a '#### <number>' line whose number is plain (72, -3, 1,000, "
                         "3.5) and ends at a space or the line's end", "whole": "some text",
                "regex": f"a match of {params.answer_regex!r} with a non-empty group 1"}
    shown = repr(_as_text(answer))
    shown = shown if len(shown) <= _SHOWN else shown[:_SHOWN - 3] + "..."
    return (f"no_ground_truth: field {params.answer_column!r} is {shown}, expected "
            f"{expected[params.answer_extraction]} (answer_extraction "
            f"{params.answer_extraction!r})")


def to_verl_frame(work: pd.DataFrame, params: DataPrepParams, split: str,
                  image_key: str) -> pd.DataFrame:
    """Turn a work frame into verl's RLHFDataset schema.

    Columns: ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model``
    (``{style: rule, ground_truth}``), ``extra_info`` (``split``, ``index``, ``question``,
    ``answer``), and the image column when the data has images.
    """
    # Truncation keeps the question as written in ``original_question``.
    originals = work["original_question"] if "original_question" in work else work["question"]
    frame = pd.DataFrame({
        "data_source": params.data_source,
        "prompt": [chat_messages(q, params) for q in work["question"]],
        "ability": params.ability,
        "reward_model": [{"style": "rule", "ground_truth": t} for t in work["ground_truth"]],
        "extra_info": [
            {"split": split, "index": i, "question": q, "answer": a}
            for i, (q, a) in enumerate(zip(originals, work["answer"], strict=True))
        ],
    })
    if image_key in work:
        frame[image_key] = list(work[image_key])
    return frame


def _check_columns(raw: RawRecords, needed: list[str], params: DataPrepParams) -> None:
    if not raw.records:
        return
    seen: set[str] = set()
    for record in raw.records:
        seen.update(record)
    absent = [c for c in needed if c not in seen]
    if absent:
        hint = ("dataset_prompt_column / prompt_template" if params.prompt_template is None
                else "prompt_template")
        raise DataError(
            f"{raw.source}: column(s) {', '.join(repr(c) for c in absent)} not found in any "
            f"record; columns found: {', '.join(sorted(seen))}. Set the data_prep parameters "
            f"({hint}, answer_column) to this dataset's columns."
        )


def _type_problem(name: str, value: Any, expected: str) -> str:
    if value is None:
        return f"field {name!r} is null, expected {expected}"
    shown = repr(value)
    shown = shown if len(shown) <= _SHOWN else shown[:_SHOWN - 3] + "..."
    return f"field {name!r} is {type(value).__name__} ({shown}), expected {expected}"


def _as_text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)
