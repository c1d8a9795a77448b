"""Prompt lengths exactly as verl counts them, without tokenizing every prompt.

verl's ``RLHFDataset`` keeps a prompt when
``len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))``
is at most ``max_prompt_length``. We count the same thing: the chat-templated text with
the generation prompt, tokenized without adding special tokens (which is what
``apply_chat_template`` does).

Tokenizing is the slow part, so the filter first computes a cheap upper bound on each
prompt's token count and tokenizes only the prompts whose bound exceeds the limit, plus a
uniform sample for the length statistics. The bound is the UTF-8 byte length of the
(normalized) text: with byte-level BPE every token covers at least one byte, and with
SentencePiece-style BPE with byte fallback every token covers at least one character,
which is at least one byte. The bound is only used for tokenizers of those two kinds; it
is also checked on every sampled prompt, and if it ever fails we tokenize everything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from rl_pipeline.models.tokenizer import chat_prompt_ids

logger = logging.getLogger(__name__)

Conversation = list[dict[str, Any]]
_BATCH = 1024
# Rows checked against apply_chat_template(tokenize=True) itself, so that a tokenizer whose
# Python wrapper adds something to the Rust encoding is caught, not silently miscounted.
_AGREEMENT_ROWS = 16


@dataclass
class LengthScan:
    """Token counts of one split's prompts.

    Attributes:
        texts: The chat-templated prompts.
        lengths: Exact token counts; -1 where only the bound was computed (and the bound is
            within the limit, so the prompt fits).
        sample: Indices counted exactly for statistics (a uniform sample, or every row).
        method: ``"bound"`` when the byte bound spared rows from tokenization, else ``"exact"``.
    """

    texts: list[str]
    lengths: np.ndarray
    sample: np.ndarray
    method: str

    def over_limit(self, limit: int) -> np.ndarray:
        """Indices of the prompts longer than ``limit`` tokens."""
        return np.flatnonzero(self.lengths > limit)


def render_prompts(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Conversation], desc: str = ""
) -> list[str]:
    """Apply the chat template with the generation prompt to each conversation."""
    texts: list[str] = []
    for start in tqdm(range(0, len(conversations), _BATCH), desc=f"Templating {desc}".strip(),
                      unit="batch", disable=_quiet(len(conversations))):
        batch = list(conversations[start:start + _BATCH])
        texts.extend(tokenizer.apply_chat_template(batch, tokenize=False,
                                                   add_generation_prompt=True))
    return texts


def count_tokens(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], desc: str = ""
) -> np.ndarray:
    """Token counts of already-templated texts, encoded in batches by the Rust tokenizer."""
    backend = tokenizer.backend_tokenizer
    counts = np.empty(len(texts), dtype=np.int64)
    for start in tqdm(range(0, len(texts), _BATCH), desc=f"Tokenizing {desc}".strip(),
                      unit="batch", disable=_quiet(len(texts))):
        encodings = backend.encode_batch(list(texts[start:start + _BATCH]),
                                         add_special_tokens=False)
        counts[start:start + len(encodings)] = [len(e.ids) for e in encodings]
    return counts


def token_upper_bound(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], int] | None:
    """A function giving a safe upper bound on a text's token count, or None if we know none.

    Safe for BPE with a byte-level pre-tokenizer or with byte fallback (see module doc).
    """
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    if not (_has_type(spec.get("pre_tokenizer"), "ByteLevel") or model.get("byte_fallback")):
        return None
    # A prefix space ("▁") may be prepended once per text segment between special tokens.
    # Every special token is one token for at least two bytes, which pays for the prepend of
    # the segment after it; only the first segment's prepend needs one token of slack.
    prepends = (_has_type(spec.get("normalizer"), "Prepend")
                or _has_type(spec.get("pre_tokenizer"), "Metaspace"))
    if prepends and any(len(t.content.encode()) < 2
                        for t in tokenizer.added_tokens_decoder.values()):
        return None
    slack = 1 if prepends else 0
    if _has_normalizers(spec.get("normalizer")):
        normalize = tokenizer.backend_tokenizer.normalizer.normalize_str
        return lambda text: len(normalize(text).encode()) + slack
    return lambda text: len(text.encode()) + slack


def scan_lengths(
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Conversation],
    limit: int,
    sample_size: int,
    seed: int,
    desc: str = "",
) -> LengthScan:
    """Count prompt tokens wherever the limit or the statistics need an exact number.

    Args:
        tokenizer: The base model's fast tokenizer with its chat template.
        conversations: The prompts as chat messages.
        limit: data_max_prompt_length.
        sample_size: How many rows to count exactly for statistics (all if fewer rows).
        seed: Seed of the uniform sample.
        desc: Label for the progress bars (the split).

    Returns:
        The scan; ``lengths`` is exact wherever it is above the limit.
    """
    texts = render_prompts(tokenizer, conversations, desc)
    n = len(texts)
    if n <= sample_size:
        sample = np.arange(n)
    else:
        sample = np.sort(np.random.default_rng(seed).choice(n, size=sample_size, replace=False))
    lengths = np.full(n, -1, dtype=np.int64)
    bound = token_upper_bound(tokenizer)
    method = "exact"
    if bound is None or len(sample) == n:
        lengths[:] = count_tokens(tokenizer, texts, desc)
    else:
        bounds = np.fromiter((bound(t) for t in texts), dtype=np.int64, count=n)
        todo = np.union1d(sample, np.flatnonzero(bounds > limit))
        lengths[todo] = count_tokens(tokenizer, [texts[i] for i in todo], desc)
        broken = sample[lengths[sample] > bounds[sample]]
        if broken.size:
            logger.warning("The byte bound on token counts failed for %d sampled prompts of "
                           "%s; counting every prompt exactly.", broken.size, desc)
            lengths[:] = count_tokens(tokenizer, texts, desc)
        else:
            method = "bound"
    if not _agrees_with_chat_template(tokenizer, conversations, lengths, sample):
        logger.warning("Batch encoding and apply_chat_template disagree on token counts for "
                       "%s; counting every prompt %s through apply_chat_template (slow).",
                       type(tokenizer).__name__, desc)
        lengths[:] = [_len_as_verl(tokenizer, c) for c in tqdm(conversations, desc=desc)]
        method = "exact"
    return LengthScan(texts=texts, lengths=lengths, sample=sample, method=method)


def truncate_question(
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    to_conversation: Callable[[str], Conversation],
    limit: int,
    side: str,
) -> tuple[str, int] | None:
    """Cut tokens from one side of the question until the templated prompt fits.

    Args:
        tokenizer: The base model's tokenizer.
        question: The question text (the part of the prompt that may be shortened).
        to_conversation: Builds the full chat messages from a question.
        limit: data_max_prompt_length.
        side: ``left`` (drop the start), ``right`` (drop the end) or ``middle``.

    Returns:
        The shortened question and its prompt's token count, or None when even an empty
        question does not fit (the system prompt, instruction and template are too long).
    """
    backend = tokenizer.backend_tokenizer
    ids = backend.encode(question, add_special_tokens=False).ids

    def prompt_len(text: str) -> int:
        rendered = render_prompts(tokenizer, [to_conversation(text)])
        return int(count_tokens(tokenizer, rendered)[0])

    keep = len(ids) - (prompt_len(question) - limit)
    # Re-encoding a cut text can merge tokens differently at the cut, so re-measure and
    # tighten until it fits; this settles in one or two rounds.
    while keep > 0:
        if side == "left":
            kept = ids[len(ids) - keep:]
        elif side == "right":
            kept = ids[:keep]
        else:
            head = keep // 2
            kept = ids[:head] + ids[len(ids) - (keep - head):]
        text = backend.decode(kept, skip_special_tokens=False).strip()
        n = prompt_len(text)
        if n <= limit:
            return text, n
        keep -= max(1, n - limit)
    return None


def _agrees_with_chat_template(tokenizer: PreTrainedTokenizerBase,
                               conversations: Sequence[Conversation], lengths: np.ndarray,
                               sample: np.ndarray) -> bool:
    return all(_len_as_verl(tokenizer, conversations[i]) == lengths[i]
               for i in sample[:_AGREEMENT_ROWS])


def _len_as_verl(tokenizer: PreTrainedTokenizerBase, conversation: Conversation) -> int:
    return len(chat_prompt_ids(tokenizer, conversation))


def _quiet(rows: int) -> bool | None:
    # No bar for small inputs; otherwise tqdm's default: shown on a terminal, not in logs.
    return True if rows < 4 * _BATCH else None


def _has_type(node: Any, name: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == name or any(_has_type(v, name) for v in node.values())
    if isinstance(node, list):
        return any(_has_type(v, name) for v in node)
    return False


def _has_normalizers(node: Any) -> bool:
    if not node:
        return False
    if node.get("type") == "Sequence":
        return any(_has_normalizers(n) for n in node.get("normalizers", []))
    return True


def length_stats(lengths: np.ndarray, sample: np.ndarray) -> dict[str, Any]:
    """Percentiles of prompt tokens over the exactly counted sample, max over all exact counts."""
    measured = lengths[sample]
    if measured.size == 0:
        return {"p50": 0, "p90": 0, "p99": 0, "max": 0, "rows_measured": 0, "sampled": False}
    p50, p90, p99 = np.percentile(measured, [50, 90, 99])
    return {
        "p50": float(p50), "p90": float(p90), "p99": float(p99),
        "max": int(lengths.max()),
        "rows_measured": int(measured.size),
        "sampled": bool(measured.size < lengths.size),
    }
