"""Which questions a model was trained on, carried with the model, so that eval compares
models only on questions neither of them has seen.

data_prep drops training questions that are also in validation, but only within one run.
A model trained before data_prep ran again (a new split of a grown dataset, another
``data.seed``, ``drop_train_val_overlap=false``) may have trained on questions that are now
validation prompts; scored on them, it looks better than it is, and the gate would promote
on that. So train writes :data:`FILE` (a digest of every training question) into its
result, merge copies it into the model folder, and eval leaves out, for each model it
compares, the validation questions that model was trained on.

Digests rather than the questions: the file travels with a published model, and a digest
is all the comparison needs. A question is the record's question as data_prep read it
(``extra_info.question``, before any truncation), the key data_prep's own overlap check
uses, so a changed prompt template or instruction does not hide a question seen before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from rl_pipeline.runs.jsonfile import read_object, write_object

FILE = "trained_questions.json"
FORMAT = 1
# 64 bits: a chance collision among a million questions is about 3e-8.
_DIGEST_CHARS = 16


def question_digests(prompts: pd.DataFrame) -> list[str]:
    """The digest of each row's question, in row order.

    The question is ``extra_info.question``; a frame without it (prompts made elsewhere)
    is keyed by its chat messages.
    """
    if "extra_info" in prompts:
        texts: Iterable[str] = (str((extra or {}).get("question", "")) for extra in
                                prompts["extra_info"])
    else:
        texts = (json.dumps([dict(m) for m in messages], sort_keys=True)
                 for messages in prompts["prompt"])
    return [hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_CHARS] for text in texts]


def write_trained_questions(folder: str | Path, prompts: pd.DataFrame) -> Path:
    """Record in ``folder`` the questions of ``prompts`` (the training prompts)."""
    path = Path(folder) / FILE
    write_object(path, {"format": FORMAT, "digest": f"sha256[:{_DIGEST_CHARS}] of the question",
                        "questions": sorted(set(question_digests(prompts)))})
    return path


def read_trained_questions(folder: str | Path) -> frozenset[str] | None:
    """The digests recorded in ``folder``; None when it has no record (a model trained
    before this record existed, or a model from elsewhere): nothing is known."""
    record = read_object(Path(folder) / FILE)
    if record.get("format") != FORMAT or not isinstance(record.get("questions"), list):
        return None
    return frozenset(record["questions"])


def trained_on(prompts: pd.DataFrame, folder: str | Path) -> pd.Series:
    """A boolean mask over ``prompts``: the rows whose question the model in ``folder`` was
    trained on (all False when the folder records nothing)."""
    seen = read_trained_questions(folder)
    if not seen:
        return pd.Series(False, index=prompts.index)
    return pd.Series([d in seen for d in question_digests(prompts)], index=prompts.index)
