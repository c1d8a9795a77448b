"""verl's per-sample warnings, once per process in the CPU mode (rl_pipeline.engines.verl.cpu.
once): verl's own function warns as its agent loop calls it, for every sample."""

from __future__ import annotations

import logging

import pytest
from verl.utils.tokenizer.continuous_token_wiring import infer_continuous_token_model_family

import rl_pipeline.engines.verl.cpu  # noqa: F401  (as verl's plugin hook imports it)
from rl_pipeline.engines.verl.cpu.once import REPEATING, install


def test_a_warning_verl_repeats_for_every_sample_is_logged_once_per_message(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=REPEATING[0]):
        for _ in range(12):  # a step's samples of conf/cpu's Llama (SmolLM2)
            infer_continuous_token_model_family(hf_model_type="llama")
        infer_continuous_token_model_family(hf_model_type="gpt_neox")  # another message
    warned = [r.getMessage() for r in caplog.records if r.name == REPEATING[0]]
    assert len(warned) == 2, warned
    assert "model_type='llama'" in warned[0] and "model_type='gpt_neox'" in warned[1]
    install()  # again, as each import of the package would: still one filter
    assert len(logging.getLogger(REPEATING[0]).filters) == 1
