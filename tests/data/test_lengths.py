"""Prompt lengths: the same count as verl's RLHFDataset, the byte bound, truncation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl.utils.dataset.rl_dataset import RLHFDataset

from rl_pipeline.data.lengths import (
    count_tokens,
    render_prompts,
    scan_lengths,
    token_upper_bound,
    truncate_question,
)
from rl_pipeline.data.prompts import chat_messages
from rl_pipeline.params import DataPrepParams
from rl_pipeline.testing import CHATML_TEMPLATE
from tests.conftest import read_gsm8k

PARAMS = DataPrepParams(instruction="Answer after ####.")


def _conversations(n: int) -> list[list[dict]]:
    questions = [r["question"] for r in read_gsm8k(n=n)]
    # Unicode, emoji and long repeats exercise multi-byte characters and merges.
    questions += ["Ünïcödé façade — 東京 costs ¥300 🚀🚀 each; how much?", "x" * 900]
    return [chat_messages(q, PARAMS) for q in questions]


def _verl_kept(tokenizer, conversations, limit: int, tmp_path: Path) -> set[int]:
    frame = pd.DataFrame({"prompt": conversations,
                          "extra_info": [{"index": i} for i in range(len(conversations))]})
    path = tmp_path / "all.parquet"
    frame.to_parquet(path)
    config = OmegaConf.create({"max_prompt_length": limit, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1,
                               "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config)
    return {row["index"] for row in dataset.dataframe["extra_info"]}


@pytest.mark.parametrize("limit", [120, 200, 320])
def test_keeps_exactly_what_verls_rlhf_dataset_keeps(tokenizer, tmp_path: Path,
                                                      limit: int) -> None:
    conversations = _conversations(300)
    # A sample smaller than the data, so the byte bound spares rows from tokenization.
    scan = scan_lengths(tokenizer, conversations, limit, sample_size=50, seed=0)
    assert scan.method == "bound"
    ours = set(range(len(conversations))) - set(scan.over_limit(limit).tolist())
    assert ours == _verl_kept(tokenizer, conversations, limit, tmp_path)
    assert 0 < len(ours) < len(conversations)  # the limit really splits the data


def test_byte_bound_holds_and_counts_match_chat_template(tokenizer) -> None:
    conversations = _conversations(200)
    texts = render_prompts(tokenizer, conversations)
    counts = count_tokens(tokenizer, texts)
    bound = token_upper_bound(tokenizer)
    assert bound is not None
    assert all(c <= bound(t) for c, t in zip(counts, texts, strict=True))
    for conv, count in zip(conversations[:20], counts[:20], strict=True):
        ids = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        assert len(ids["input_ids"]) == count


def test_no_bound_for_a_tokenizer_it_cannot_vouch_for() -> None:
    # WordPiece with a lowercasing, accent-stripping normalizer: no byte bound is safe.
    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tok.chat_template = CHATML_TEMPLATE
    assert token_upper_bound(tok) is None
    scan = scan_lengths(tok, [[{"role": "user", "content": "a b"}]] * 3, 10, 1, 0)
    assert scan.method == "exact" and (scan.lengths >= 0).all()


def test_sample_gives_exact_counts_where_needed(tokenizer) -> None:
    conversations = _conversations(400)
    limit = 200
    scan = scan_lengths(tokenizer, conversations, limit, sample_size=100, seed=3)
    exact = count_tokens(tokenizer, render_prompts(tokenizer, conversations))
    measured = scan.lengths >= 0
    assert measured.sum() >= 100
    np.testing.assert_array_equal(scan.lengths[measured], exact[measured])
    # Every row left unmeasured really fits, and every overlong row was measured.
    assert (exact[~measured] <= limit).all()
    np.testing.assert_array_equal(scan.over_limit(limit), np.flatnonzero(exact > limit))


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncation_makes_the_templated_prompt_fit(tokenizer, side: str) -> None:
    question = " ".join(r["question"] for r in read_gsm8k(n=4))
    limit = 120
    to_conv = lambda q: chat_messages(q, PARAMS)  # noqa: E731
    full = count_tokens(tokenizer, render_prompts(tokenizer, [to_conv(question)]))[0]
    assert full > limit
    text, n = truncate_question(tokenizer, question, to_conv, limit, side)
    # The proof that it fits: count the final prompt independently, as verl would.
    ids = tokenizer.apply_chat_template(to_conv(text), add_generation_prompt=True,
                                        tokenize=True)["input_ids"]
    assert len(ids) == n <= limit
    assert n >= limit - 5  # cut no more than needed
    assert len(text) < len(question)
    head, tail = question[:30], question[-30:]
    kept = {"left": (False, True), "right": (True, False), "middle": (True, True)}[side]
    assert (text.startswith(head), text.endswith(tail)) == kept
    assert "Answer after ####." in to_conv(text)[-1]["content"]  # the instruction survives


def test_truncation_gives_up_when_the_template_alone_is_too_long(tokenizer) -> None:
    params = DataPrepParams(system_prompt="You are a careful assistant. " * 20)
    out = truncate_question(tokenizer, "How many apples?", lambda q: chat_messages(q, params),
                            30, "left")
    assert out is None
