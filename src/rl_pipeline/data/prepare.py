"""The data_prep steps as plain functions: records to clean splits, then lengths to fit."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from transformers import PreTrainedTokenizerBase

from rl_pipeline.data import hygiene
from rl_pipeline.data.lengths import length_stats, scan_lengths, truncate_question
from rl_pipeline.data.prompts import DataError, chat_messages, extract_work_frame
from rl_pipeline.data.records import BadRecord, RawRecords
from rl_pipeline.params import DataParams, DataPrepParams

logger = logging.getLogger(__name__)

SPLITS = ("train", "val")
# Every reason a row can be dropped for; the report lists each, zero or not, so runs compare.
DROP_REASONS = ("bad_record", "empty_prompt", "no_ground_truth", "duplicate_prompt",
                "train_val_overlap", "overlong_prompt")
_LISTED = 10  # rows named in an error message before "and N more"
# What to change when a reason empties a split (the hints that quote values: _drop_hint).
_DROP_HINTS = {
    "bad_record": "records unreadable, missing a field or holding one as another type: check "
                  "the data_prep columns against the data; data_prep.on_bad_record=error names "
                  "each by file and line",
    "empty_prompt": "empty text in the prompt field(s): check data_prep.dataset_prompt_column "
                    "or prompt_template",
    "duplicate_prompt": "data_prep.drop_duplicates=false keeps them",
    "train_val_overlap": "prompts that are also in val: data_prep.drop_train_val_overlap=false "
                         "keeps them, or give a validation input without them",
}


@dataclass
class Hygiene:
    """What happened to the rows of both splits before the length filter."""

    rows_in: dict[str, int]
    dropped: dict[str, Counter]
    bad_records: list[str]
    filtered_rows: list[str]  # dropped for an empty prompt or no ground truth: where, why
    train_val_overlap: int
    val_source: str
    val_split_off: int = 0  # train rows moved to val when there is no validation input
    train_source: str = ""  # where the training records came from (RawRecords.source)

    def as_dict(self) -> dict[str, Any]:
        return {"rows_in": self.rows_in,
                "dropped": {s: dict(c) for s, c in self.dropped.items()},
                "bad_records": self.bad_records, "filtered_rows": self.filtered_rows,
                "train_val_overlap": self.train_val_overlap,
                "train_source": self.train_source, "val_source": self.val_source,
                "val_split_off": self.val_split_off}


@dataclass
class FittedSplit:
    """One split after the length filter or truncation."""

    work: pd.DataFrame
    stats: dict[str, Any]
    dropped: Counter = field(default_factory=Counter)
    truncated: int = 0
    sample_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    shortest_overlong: int | None = None  # tokens of the shortest prompt dropped as overlong


def clean_splits(raw_train: RawRecords, raw_val: RawRecords | None, params: DataPrepParams,
                 image_key: str) -> tuple[pd.DataFrame, pd.DataFrame, Hygiene]:
    """Map records to work frames, drop bad rows, split off validation, deduplicate.

    Raises:
        DataError: On a bad record with ``on_bad_record: error`` (naming file and line), a
            missing column, an empty input, or no rows left in a split (naming the rows in
            and the drops by reason).
    """
    dropped = {s: Counter() for s in SPLITS}
    skipped: list[BadRecord] = []
    filtered_rows: list[str] = []
    frames: dict[str, pd.DataFrame] = {}
    rows_in = {"train": 0, "val": 0}
    empty: list[str] = []
    for split, raw in (("train", raw_train), ("val", raw_val)):
        if raw is None:
            continue
        rows_in[split] = len(raw.records) + len(raw.bad)
        try:
            work, reasons, bad, filtered = extract_work_frame(raw, params, image_key)
        except DataError as exc:
            if split == "train":
                raise
            # A user who set only dataset_train_split gets the catalog's default validation
            # input (GSM8K's test set), whose columns are not theirs: say which input it is.
            raise DataError(f"{str(exc).rstrip('.')}. This is the validation input "
                            "(dataset_validation_split "
                            "in conf/*/catalog.yml): point it at your validation file, or "
                            "set it empty (--params dataset_validation_split=) to split "
                            "validation off the training file.") from None
        bad = sorted(raw.bad + bad, key=lambda record: record.line)  # unreadable, then unusable
        if bad and params.on_bad_record == "error":
            advice = ("Fix them, or set data_prep.on_bad_record=skip to drop and count them."
                      if raw.records else
                      # Skipping them all would leave nothing: say what the file is not.
                      "No line of it is a JSON object: it is not JSON Lines (one JSON object "
                      "per line). For a CSV, JSON or Parquet file, set dataset_name to a "
                      "folder that holds it (Hugging Face datasets reads those).")
            raise DataError(_list_problems(
                f"{len(bad)} bad record(s) in {raw.source}", [b.describe() for b in bad],
                advice))
        dropped[split].update(reasons)
        if filtered:
            logger.warning("%s: dropped %d row(s) with no usable prompt or ground truth (the "
                           "report lists them), e.g. %s", split, len(filtered),
                           filtered[0].describe())
            filtered_rows.extend(b.describe() for b in filtered)
        if bad:
            dropped[split]["bad_record"] += len(bad)
            skipped.extend(bad)
        if params.drop_duplicates:
            work, n = hygiene.drop_duplicate_questions(work)
            if n:
                dropped[split]["duplicate_prompt"] += n
        if work.empty:
            empty.append(empty_split_message(split, rows_in[split], dropped[split], params))
        frames[split] = work
    _raise_if_empty(empty)

    split_off = 0
    if raw_val is None:
        frames["train"], frames["val"] = hygiene.split_validation(
            frames["train"], params.val_fraction, params.seed)
        val_source = f"split from train (val_fraction={params.val_fraction}, seed={params.seed})"
        split_off = len(frames["val"])
    else:
        val_source = raw_val.source

    overlap = hygiene.train_val_overlap(frames["train"], frames["val"])
    n_overlap = int(overlap.sum())
    if n_overlap and params.drop_train_val_overlap:
        frames["train"] = frames["train"][~overlap].reset_index(drop=True)
        dropped["train"]["train_val_overlap"] += n_overlap
    if frames["train"].empty:
        _raise_if_empty([empty_split_message("train", rows_in["train"], dropped["train"], params,
                                             split_off=split_off)])
    return frames["train"], frames["val"], Hygiene(
        rows_in=rows_in, dropped=dropped, bad_records=[b.describe() for b in skipped],
        filtered_rows=filtered_rows, train_val_overlap=n_overlap, val_source=val_source,
        val_split_off=split_off, train_source=raw_train.source)


def fit_split(work: pd.DataFrame, split: str, tokenizer: PreTrainedTokenizerBase,
              params: DataPrepParams, data: DataParams) -> FittedSplit:
    """Measure prompt lengths; drop, truncate or refuse the prompts over the limit.

    Raises:
        DataError: With ``data_truncation: error`` and filtering off, naming each overlong
            row and its length; or when truncation cannot make a prompt fit.
    """
    limit = data.data_max_prompt_length
    conversations = [chat_messages(q, params) for q in work["question"]]
    scan = scan_lengths(tokenizer, conversations, limit, params.length_sample_size,
                        params.seed, desc=split)
    over = scan.over_limit(limit)
    fitted = FittedSplit(work=work, stats={**length_stats(scan.lengths, scan.sample),
                                           "method": scan.method},
                         sample_lengths=scan.lengths[scan.sample])
    if over.size == 0:
        return fitted
    if data.data_filter_overlong_prompts:
        fitted.work = work.drop(index=work.index[over]).reset_index(drop=True)
        fitted.dropped["overlong_prompt"] = int(over.size)
        # Prompts over the limit are always counted exactly, so this is their true minimum.
        fitted.shortest_overlong = int(scan.lengths[over].min())
        logger.info("%s: dropped %d prompt(s) longer than %d tokens", split, over.size, limit)
        return fitted
    if data.data_truncation == "error":
        raise DataError(_list_problems(
            f"{over.size} {split} prompt(s) longer than data_max_prompt_length={limit} tokens",
            [f"{work.at[i, 'origin']} {work.at[i, 'line']} ({scan.lengths[i]} tokens)"
             for i in over],
            "Set data.data_filter_overlong_prompts=true to drop them, data.data_truncation to "
            "left, right or middle to shorten them, or raise data.data_max_prompt_length."))
    fitted.work = _truncate(work, over, split, tokenizer, params, data)
    fitted.truncated = int(over.size)
    return fitted


def _truncate(work: pd.DataFrame, rows: np.ndarray, split: str,
              tokenizer: PreTrainedTokenizerBase, params: DataPrepParams,
              data: DataParams) -> pd.DataFrame:
    work = work.copy()
    work["original_question"] = work["question"]
    failed = []
    for i in rows:
        cut = truncate_question(tokenizer, work.at[i, "question"],
                                lambda q: chat_messages(q, params),
                                data.data_max_prompt_length, data.data_truncation)
        if cut is None:
            failed.append(f"{work.at[i, 'origin']} {work.at[i, 'line']}")
        else:
            work.at[i, "question"] = cut[0]
    if failed:
        raise DataError(_list_problems(
            f"{len(failed)} {split} prompt(s) cannot be truncated to "
            f"data_max_prompt_length={data.data_max_prompt_length} tokens: the system prompt, "
            "instruction and chat template alone are longer", failed,
            "Raise data.data_max_prompt_length or shorten system_prompt / instruction."))
    logger.info("%s: truncated %d prompt(s) (%s)", split, rows.size, data.data_truncation)
    return work


def fit_splits(works: dict[str, pd.DataFrame], hygiene: dict[str, Any],
               tokenizer: PreTrainedTokenizerBase, params: DataPrepParams,
               data: DataParams) -> dict[str, FittedSplit]:
    """:func:`fit_split` for each split, failing if the length filter leaves one empty.

    Args:
        works: The work frames by split, as :func:`clean_splits` left them.
        hygiene: :meth:`Hygiene.as_dict` of that cleaning, so that an empty split's error
            counts every row that came in and every drop, cleaning's and the filter's.

    Raises:
        DataError: As :func:`fit_split`; or when a split has no rows left. An empty prompt
            file would only fail later, in training, with an IndexError and no cause.
    """
    fitted = {split: fit_split(works[split], split, tokenizer, params, data) for split in SPLITS}
    empty = []
    for split, fit in fitted.items():
        if fit.work.empty:
            rows_in, split_off = _rows_in(hygiene, split)
            empty.append(empty_split_message(
                split, rows_in, Counter(hygiene["dropped"][split]) + fit.dropped, params,
                split_off=split_off, limit=data.data_max_prompt_length,
                shortest=fit.shortest_overlong))
    _raise_if_empty(empty)
    return fitted


def empty_split_message(split: str, rows_in: int, dropped: Counter, params: DataPrepParams, *,
                        split_off: int = 0, limit: int | None = None,
                        shortest: int | None = None) -> str:
    """Why a split has no rows left: the rows that came in, each reason's drops and what
    to change for it.

    Args:
        split: ``train`` or ``val``.
        rows_in: Rows of the split's input (for val split off train: the rows split off).
        dropped: Rows dropped by reason, over every step so far.
        split_off: Train rows moved to val (for train), or the rows val was made of (for val).
        limit: ``data.data_max_prompt_length``, once lengths were filtered.
        shortest: Tokens of the shortest prompt dropped as overlong.
    """
    if split == "train" and split_off:
        came = f"{rows_in} train row(s) came in ({split_off} of them split off as val)"
    elif split == "val" and split_off:
        came = f"{rows_in} val row(s) came in (split off train)"
    else:
        came = f"{rows_in} {split} row(s) came in"
    causes = [f"    {reason}: {dropped[reason]} - {_drop_hint(reason, params, limit, shortest)}"
              for reason in DROP_REASONS if dropped.get(reason)]
    return f"  no {split} prompts left: {came}, dropped:\n" + "\n".join(causes or ["    none"])


def _rows_in(hygiene: dict[str, Any], split: str) -> tuple[int, int]:
    split_off = hygiene.get("val_split_off", 0)
    if split == "val" and split_off:
        return split_off, split_off
    return hygiene["rows_in"][split], split_off


def _drop_hint(reason: str, params: DataPrepParams, limit: int | None,
               shortest: int | None) -> str:
    if reason == "overlong_prompt":
        raise_to = (f"; the shortest has {shortest} tokens: raise it to at least {shortest}"
                    if shortest is not None else ": raise it")
        return (f"longer than data.data_max_prompt_length={limit}{raise_to}, or shorten "
                "prompts instead with data.data_filter_overlong_prompts=false and "
                "data.data_truncation=left, right or middle")
    if reason == "no_ground_truth":
        regex = (f", answer_regex={params.answer_regex!r}"
                 if params.answer_extraction == "regex" else "")
        return (f"no ground truth found by data_prep.answer_extraction="
                f"{params.answer_extraction!r}{regex} in answer_column="
                f"{params.answer_column!r}: check them against the data")
    return _DROP_HINTS[reason]


def _raise_if_empty(messages: list[str]) -> None:
    # Raised before the node returns, so Kedro saves none of its outputs: no prompt file
    # with zero rows is published for training to pick up.
    if messages:
        raise DataError("every row of a split was dropped; nothing was written:\n"
                        + "\n".join(messages))


def _list_problems(headline: str, items: list[str], advice: str) -> str:
    listed = "\n".join(f"  - {item}" for item in items[:_LISTED])
    more = f"\n  ... and {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return f"{headline}:\n{listed}{more}\n{advice}"
