"""The CPU rollout samples as verl asks (vLLM's conventions), on a tiny real model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_pipeline.engines.verl.hf_rollout import sampling_config


@pytest.mark.parametrize(("top_k", "most"), [(-1, 400), (5, 5)])
def test_top_k_off_samples_the_whole_vocabulary(tiny_model_dir, top_k: int, most: int) -> None:
    """verl's top_k -1 (no top-k; conf/cpu's, as TRL's 0) must not become transformers'
    default of 50 tokens."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    config = sampling_config({"temperature": 20.0, "top_p": 1.0, "top_k": top_k}, 1,
                             eos_ids=[0], pad_id=0)
    config.min_new_tokens = 1
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([[5, 9, 2]] * 400), generation_config=config)
    distinct = set(out.sequences[:, -1].tolist())
    assert len(distinct) <= most
    assert len(distinct) > (50 if top_k < 0 else 1)
