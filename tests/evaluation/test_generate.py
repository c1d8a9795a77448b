"""The Hugging Face back end on a tiny real model."""

from __future__ import annotations

import pytest

from rl_pipeline.evaluation.generate import HFGenerator, SamplingSettings, pick_backend


def _conversations(n: int) -> list[list[dict]]:
    questions = ["What is 2 + 3?", "A farmer has 12 cows and buys 7 more. How many cows?",
                 "Add 1.", "If Tom reads 15 pages a day for 4 days, how many pages does he read?"]
    return [[{"role": "user", "content": questions[i % 4] * (1 + i % 3)}] for i in range(n)]


@pytest.fixture(scope="module")
def generator(tiny_model_dir) -> HFGenerator:
    return HFGenerator(str(tiny_model_dir))


@pytest.mark.slow
def test_batched_greedy_equals_one_prompt_at_a_time(generator) -> None:
    settings = SamplingSettings(max_new_tokens=24, greedy=True)
    batched = generator.generate(_conversations(6), settings, batch_size=6)
    single = generator.generate(_conversations(6), settings, batch_size=1)
    assert [g.text for g in batched] == [g.text for g in single]
    assert [g.tokens for g in batched] == [g.tokens for g in single]
    assert [(g.prompt_index, g.sample_index) for g in batched] == [(i, 0) for i in range(6)]


@pytest.mark.slow
def test_samples_per_prompt_and_truncation_flag(generator) -> None:
    settings = SamplingSettings(max_new_tokens=8, n_samples=3, temperature=1.0, top_p=1.0,
                                min_new_tokens=8)
    out = generator.generate(_conversations(2), settings, batch_size=2)
    assert [(g.prompt_index, g.sample_index) for g in out] == [(p, s) for p in range(2)
                                                               for s in range(3)]
    assert all(g.tokens == 8 and g.truncated for g in out)  # forced to the cap


@pytest.mark.slow
def test_sampling_is_seeded(generator) -> None:
    settings = SamplingSettings(max_new_tokens=16, n_samples=2, temperature=1.0, top_p=1.0,
                                seed=7)
    first = [g.text for g in generator.generate(_conversations(3), settings)]
    again = [g.text for g in generator.generate(_conversations(3), settings)]
    assert first == again


def test_vllm_is_refused_without_a_gpu() -> None:
    assert pick_backend("auto") == "hf"  # CPU machines
    with pytest.raises(RuntimeError, match="needs vLLM and a CUDA GPU"):
        pick_backend("vllm")


def test_expanding_grouped_query_attention_keeps_the_outputs(tiny_model_dir) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rl_pipeline.evaluation.generate import expand_grouped_query_attention

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    ids = torch.tensor([[3, 17, 42, 99, 7], [5, 6, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # left padding, as in batches
    with torch.inference_mode():
        before = model(input_ids=ids, attention_mask=mask).logits
        assert expand_grouped_query_attention(model)
        after = model(input_ids=ids, attention_mask=mask).logits
    assert model.config.num_key_value_heads == model.config.num_attention_heads
    assert model.model.layers[0].self_attn.k_proj.out_features == model.config.hidden_size
    assert torch.allclose(before, after, atol=1e-6)
    assert not expand_grouped_query_attention(model)  # already multi-head: nothing to do


@pytest.mark.slow
def test_each_model_generates_in_a_process_of_its_own(tiny_model_dir) -> None:
    """vLLM keeps GPU memory after its engine is deleted: each model's generation runs in a
    child that returns everything when it exits (forced here, where the default, a CPU, would
    not need it)."""
    import os

    from rl_pipeline.evaluation.generate import generate

    settings = SamplingSettings(max_new_tokens=12, greedy=True)
    here = generate(str(tiny_model_dir), _conversations(3), settings, backend="hf")
    first = generate(str(tiny_model_dir), _conversations(3), settings, backend="hf",
                     own_process=True)
    second = generate(str(tiny_model_dir), _conversations(3), settings, backend="hf",
                      own_process=True)
    assert here.pid == os.getpid()  # no GPU: no child needed
    assert os.getpid() not in (first.pid, second.pid) and first.pid != second.pid
    assert [g.text for g in first.generations] == [g.text for g in here.generations]
    assert first.device == "cpu" and first.peak_memory_mib > 0


def test_the_peak_sampler_catches_memory_freed_before_the_block_ends() -> None:
    """What eval does on a GPU (sampling the device's used memory while another process, vLLM's
    engine, allocates it), here with this process's resident memory as the quantity."""
    import os
    import time

    import torch

    from rl_pipeline.evaluation.generate import PeakSampler

    page = os.sysconf("SC_PAGE_SIZE")

    def resident_mib() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page / 2**20

    before = resident_mib()
    with PeakSampler(resident_mib, interval_s=0.01) as sampler:
        block = torch.ones(100 * 2**20, dtype=torch.float32)  # 400 MiB, touched
        time.sleep(0.2)
        del block
        time.sleep(0.05)
    assert sampler.peak >= before + 350
    assert resident_mib() < sampler.peak - 300  # freed before the block ended: only sampled
    with PeakSampler(None) as idle:
        pass
    assert idle.peak == 0.0


@pytest.mark.parametrize(("top_k", "most"), [(-1, 400), (5, 5)])
def test_top_k_off_samples_the_whole_vocabulary(generator, top_k: int, most: int) -> None:
    """-1 is no top-k. (Passed to transformers as None, generate's default of 50 applied.)"""
    settings = SamplingSettings(max_new_tokens=1, min_new_tokens=1, n_samples=400,
                                temperature=20.0, top_p=1.0, top_k=top_k)
    distinct = {g.text for g in generator.generate(_conversations(1), settings)}
    assert len(distinct) <= most
    assert len(distinct) > (50 if top_k < 0 else 1)
