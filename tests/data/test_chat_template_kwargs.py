"""data.data_apply_chat_template_kwargs: one set of chat-template arguments for data_prep's
length filter, verl's rollout and checks, TRL, eval and the merged model's card."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

from rl_pipeline.data.lengths import scan_lengths
from rl_pipeline.engines.trl.config import grpo_values
from rl_pipeline.engines.verl.config import compose_verl_config, hydra_overrides, spec_values
from rl_pipeline.evaluation.generate import sampling_settings
from rl_pipeline.model_card import card_facts, render_card
from rl_pipeline.models.tokenizer import load_tokenizer
from rl_pipeline.params import ConfigError, DataParams, EvalParams, TrainParams, resolve_followers
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.params.verl import VerlParams
from rl_pipeline.testing import CHATML_TEMPLATE

# Qwen3's way: with enable_thinking false, the generation prompt holds an empty think block.
THINKING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\n' }}",
    "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}")
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def thinking_dir(tokenizer_dir: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("thinking") / "tok"
    shutil.copytree(tokenizer_dir, folder)
    tok = load_tokenizer(folder)
    tok.chat_template = THINKING_TEMPLATE
    tok.save_pretrained(folder)
    return folder


def test_the_bound_arguments_reach_every_apply_chat_template_call(thinking_dir) -> None:
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    plain = load_tokenizer(thinking_dir)
    bound = load_tokenizer(thinking_dir, NO_THINKING)
    assert "<think>" not in plain.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
    assert bound.apply_chat_template(messages, tokenize=False,
                                     add_generation_prompt=True).endswith("</think>\n\n")
    # a caller's own argument wins
    assert "<think>" not in bound.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True,
                                                      enable_thinking=True)


def test_data_preps_length_filter_keeps_what_verl_keeps_with_the_same_arguments(
        thinking_dir, tmp_path: Path) -> None:
    import pandas as pd

    # Prompts 8 to 40 words long: the think block's tokens decide some of them.
    conversations = [[{"role": "user", "content": " ".join(["seven"] * n)}]
                     for n in range(8, 41)]
    bound = load_tokenizer(thinking_dir, NO_THINKING)
    lengths = scan_lengths(bound, conversations, 10**6, sample_size=len(conversations),
                           seed=0).lengths
    plain_lengths = scan_lengths(load_tokenizer(thinking_dir), conversations, 10**6,
                                 sample_size=len(conversations), seed=0).lengths
    assert (lengths > plain_lengths).all()  # the arguments changed every count
    limit = int(sorted(lengths)[len(lengths) // 2])
    ours = {i for i, n in enumerate(lengths) if n <= limit}
    frame = pd.DataFrame({"prompt": conversations,
                          "extra_info": [{"index": i} for i in range(len(conversations))]})
    frame.to_parquet(tmp_path / "all.parquet")
    dataset = RLHFDataset(data_files=[str(tmp_path / "all.parquet")], tokenizer=load_tokenizer(
        thinking_dir), config=OmegaConf.create({
            "max_prompt_length": limit, "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache"),
            "apply_chat_template_kwargs": NO_THINKING}))
    assert ours == {row["index"] for row in dataset.dataframe["extra_info"]}


def test_verl_trl_and_eval_get_the_same_arguments() -> None:
    data = DataParams(data_apply_chat_template_kwargs=NO_THINKING)
    config = compose_verl_config(hydra_overrides(spec_values(VerlParams(), data)))
    assert OmegaConf.to_container(config.data.apply_chat_template_kwargs) == NO_THINKING
    groups = resolve_followers({"train": TrainParams(), "eval": EvalParams(), "data": data})
    assert grpo_values(groups["train"].trl)["chat_template_kwargs"] == NO_THINKING
    assert sampling_settings(groups["eval"], data).chat_template_kwargs == NO_THINKING
    with pytest.raises(ConfigError, match="train.trl.chat_template_kwargs"):
        resolve_followers({"train": TrainParams(trl=TrlParams(
            chat_template_kwargs={"enable_thinking": True})), "data": data})


def test_the_merged_models_card_says_which_arguments_it_was_trained_with() -> None:
    facts = card_facts({"base_model": "b", "training_run": {
        "engine": "verl", "chat_template_kwargs": NO_THINKING}}, "m", "apache-2.0", {})
    assert ('- chat template arguments: `{"enable_thinking": false}`: it was trained on '
            "prompts made with them") in render_card(facts)
    assert "chat template arguments" not in render_card(card_facts({}, "m", "mit", {}))
