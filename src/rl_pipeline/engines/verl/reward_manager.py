"""verl's naive reward manager, telling the reward how each response ended.

verl's reward managers call ``compute_score`` with the decoded text only (special tokens
skipped), so a reward cannot tell a response that ended by itself from one the length cap
cut off, and format credit could be farmed by a guess repeated to the cap. This manager
adds the response's length, the cap and whether it was truncated to ``extra_info``
(:func:`~rl_pipeline.rewards.form.response_facts`), as the trl engine and eval do, and
leaves the rest to verl's ``NaiveRewardManager``. verl loads it through its own extension
point, ``reward.reward_manager.source=importlib`` (:data:`OVERRIDES`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

from rl_pipeline.rewards.form import response_facts
from rl_pipeline.rewards.scoring import prepare_verl_reward

MODULE = "pkg://rl_pipeline.engines.verl.reward_manager"
OVERRIDES = ("reward.reward_manager.source=importlib",
             "reward.reward_manager.name=ResponseFactsRewardManager",
             f"reward.reward_manager.module.path={MODULE}")


class ResponseFactsRewardManager(NaiveRewardManager):
    """``NaiveRewardManager`` with :func:`~rl_pipeline.rewards.form.response_facts` in
    each sample's ``extra_info``.

    A response is truncated when it fills ``data.max_response_length`` tokens and its last
    token is neither end-of-sequence nor padding (TRL's test, and eval's).
    """

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any,
                 **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score, **kwargs)
        self.cap = int(config.data.max_response_length)
        self.stop_ids = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id)
                         if i is not None}
        custom = config.reward.get("custom_reward_function") or {}
        reward = (custom.get("reward_kwargs") or {}).get("reward")
        # Ours (verl_reward), among several reward workers (verl's GPU default, 8): start
        # the scorer processes now, this worker's share of the cores. One worker (the CPU
        # mode) gets step 1's first sample anyway, and starting them beside the models'
        # load cost verl runs on 2 cores ~7 s.
        reward_workers = int(config.reward.get("num_workers") or 1)
        if isinstance(reward, str) and reward_workers > 1:
            prepare_verl_reward(reward, reward_workers)

    async def run_single(self, data: Any) -> dict:
        item = data[-1]
        responses = item.batch["responses"]
        length = int(item.batch["attention_mask"][-responses.shape[-1]:].sum())
        ended = length > 0 and int(responses[length - 1]) in self.stop_ids
        # A copy per sample: verl repeats one extra_info dict over a prompt's n responses.
        infos = np.empty(len(data), dtype=object)
        infos[:] = list(data.non_tensor_batch.get("extra_info", [None] * len(data)))
        infos[-1] = {**(infos[-1] or {}),
                     **response_facts(length, self.cap, not ended and length >= self.cap)}
        data.non_tensor_batch["extra_info"] = infos
        return await super().run_single(data)
