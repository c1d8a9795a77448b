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
from rl_pipeline.rewards.form import TRUNCATED, response_facts
from rl_pipeline.training_rollouts import Rollout, last_user_turn, log_table, step_metrics


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

    TRL calls it once per step with all of the step's completions, so it also reports
    them: the degeneration rates and the reward's parts (its errors and timeouts included)
    through TRL's ``log_metric`` (logged with the step's metrics, ``rollouts/...`` as on
    verl), and
    the first ``rollouts_per_step`` rollouts to the train run's table
    (:mod:`rl_pipeline.training_rollouts`).
    """

    def __init__(self, reward: RewardParams, stop_ids: Sequence[int | None] = (),
                 max_completion_length: int | None = None, rollouts_per_step: int = 0) -> None:
        self.safe = build_reward(reward)
        self.stop_ids = {i for i in stop_ids if i is not None}
        self.cap = max_completion_length
        self.rollouts_per_step = rollouts_per_step
        # TRL names its metrics after it (rewards/<name>/mean), and logs its time straight to
        # MLflow ("profiling/Time taken: GRPOTrainer.<name>"), which refuses a "+" in a name:
        # terms are joined with "-" (their labels are letters, digits and _).
        self.__name__ = "-".join(t.metric for t in reward.terms) if reward.terms else \
            reward.custom_reward_function.name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 data_source: Sequence[str], ground_truth: Sequence[str],
                 extra_info: Sequence[str], completion_ids: Sequence[Sequence[int]] = (),
                 trainer_state: Any = None, log_metric: Any = None,
                 **_: Any) -> list[float]:
        ids = list(completion_ids) or [None] * len(completions)
        facts = [self._facts(tokens) for tokens in ids]
        texts = [_text(completion) for completion in completions]
        samples = [(source, text, truth, {**(json.loads(info) or {}), **fact})
                   for source, text, truth, info, fact in zip(
                       data_source, texts, ground_truth, extra_info, facts, strict=True)]
        rollouts = [Rollout(last_user_turn(prompt), text, str(truth), scored.reward,
                            bool(fact.get(TRUNCATED, False)), scored.parts())
                    for prompt, text, truth, fact, scored in zip(
                        prompts, texts, ground_truth, facts, self.safe.score_batch(samples),
                        strict=True)]
        # TRL averages each over its processes: on several GPUs reward/min and /max are the
        # processes' mean of theirs, a band clipped a little tighter than the batch's.
        for name, value in step_metrics(rollouts).items():
            if log_metric is not None:
                log_metric(name, value)
        # TRL scores evaluation completions too (do_eval); only training's go in the table.
        # log_metric is the trainer's own method, so its model says which this is.
        trainer = getattr(log_metric, "__self__", None)
        training = getattr(getattr(trainer, "model", None), "training", True)
        if trainer_state is not None and training:  # the step after the last one done
            log_table(trainer_state.global_step + 1, rollouts, self.rollouts_per_step)
        return [r.reward for r in rollouts]

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
