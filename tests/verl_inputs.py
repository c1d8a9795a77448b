"""What the verl tests share: a batch configuration one GPU (or one gloo rank) can run,
GSM8K prompts in verl's RLHFDataset schema (the ``inputs`` fixture in conftest.py), and a
checkpoint in verl's FSDP layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import torch

from rl_pipeline.data.prompts import to_verl_frame
from rl_pipeline.params import DataPrepParams
from tests.conftest import read_gsm8k

# A configuration a one-GPU machine can run, for the tiny parquet files of verl_prompts.
SMALL = {"data_train_batch_size": 8, "actor_ppo_mini_batch_size": 8,
         "actor_rft_mini_batch_size": 8, "actor_ppo_micro_batch_size_per_gpu": 4,
         "actor_rft_micro_batch_size_per_gpu": 4, "trainer_n_gpus_per_node": 1,
         "rollout_tensor_model_parallel_size": 1}


def verl_prompts(path: Path, n: int, split: str) -> str:
    """The first ``n`` GSM8K training records as verl's prompt parquet at ``path``."""
    records = read_gsm8k(n=n)
    work = pd.DataFrame({"question": [r["question"] for r in records],
                         "answer": [r["answer"] for r in records],
                         "ground_truth": [r["answer"].split("#### ")[-1] for r in records]})
    to_verl_frame(work, DataPrepParams(), split, "images").to_parquet(path)
    return str(path)


def verl_checkpoint(model_dir: Path, root: Path, step: int = 3) -> tuple[Path, dict]:
    """A single-GPU (world size 1) checkpoint in verl's layout, with changed weights: the
    ``global_step_N/actor`` folder and its state dict."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    with torch.no_grad():  # "training": parameters, so tied embeddings stay tied
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, actor / "huggingface" / f.name)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor, state
