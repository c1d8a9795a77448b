"""What the verl tests share: a batch configuration one GPU (or one gloo rank) can run, and
GSM8K prompts in verl's RLHFDataset schema (the ``inputs`` fixture in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rl_pipeline.config import DataPrepParams
from rl_pipeline.data.prompts import to_verl_frame
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
