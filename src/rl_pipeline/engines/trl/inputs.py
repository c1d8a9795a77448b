"""What TRL's GRPOTrainer takes from the project: the prompts as its conversational dataset,
and the ``reward`` group's function as its reward function."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.form import response_facts


def prompts_dataset(frame: pd.DataFrame) -> Any:
    """verl-schema prompt rows as TRL's conversational dataset.

    ``prompt`` holds the chat messages; ``data_source``, ``ground_truth`` and
    ``extra_info`` (JSON text, as Arrow cannot hold free-form dicts) go to the reward.
    """
    from datasets import Dataset

    return Dataset.from_dict({
        "prompt": [[{"role": str(m["role"]), "content": str(m["content"])} for m in p]
                   for p in frame["prompt"]],
        "data_source": [str(s) for s in frame["data_source"]],
        "ground_truth": [str(rm["ground_truth"]) for rm in frame["reward_model"]],
        "extra_info": [json.dumps(plain(e)) for e in frame.get("extra_info",
                                                               [None] * len(frame))],
    })


class TrlReward:
    """The ``reward`` group's function (verl's signature) as a TRL reward function.

    TRL passes each completion's token ids; whether it ended by itself (its last token an
    end-of-sequence or padding token, TRL's own ``mask_truncated_completions`` test) and its
    length go to the reward in ``extra_info`` (:func:`~rl_pipeline.rewards.form.
    response_facts`), as eval and the verl engine give them.
    """

    def __init__(self, reward: RewardParams, stop_ids: Sequence[int | None] = (),
                 max_completion_length: int | None = None) -> None:
        self.safe = build_reward(reward)
        self.stop_ids = {i for i in stop_ids if i is not None}
        self.cap = max_completion_length
        self.__name__ = reward.custom_reward_function.name  # TRL names its metrics after it

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 data_source: Sequence[str], ground_truth: Sequence[str],
                 extra_info: Sequence[str], completion_ids: Sequence[Sequence[int]] = (),
                 **_: Any) -> list[float]:
        ids = list(completion_ids) or [None] * len(completions)
        return [self.safe(source, _text(completion), truth,
                          {**(json.loads(info) or {}), **self._facts(tokens)})
                for completion, source, truth, info, tokens in zip(
                    completions, data_source, ground_truth, extra_info, ids, strict=True)]

    def _facts(self, tokens: Sequence[int] | None) -> dict[str, Any]:
        if tokens is None or self.cap is None:
            return {}
        ended = bool(tokens) and tokens[-1] in self.stop_ids
        return response_facts(len(tokens), self.cap, truncated=not ended)


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", ...}]
        return "".join(str(m.get("content", "")) for m in completion)
    return str(completion)


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
