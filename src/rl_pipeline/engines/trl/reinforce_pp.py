"""REINFORCE++ on TRL: a GRPOTrainer subclass with REINFORCE++ advantages."""

from __future__ import annotations

import functools

import torch


@functools.cache
def trainer_class(estimator: str) -> type:
    """TRL's GRPOTrainer for ``grpo``; for ``reinforce_plus_plus`` a subclass with REINFORCE++
    advantages. Built on first use: importing trl takes seconds."""
    from trl import GRPOTrainer
    from trl.trainer.utils import nanstd

    if estimator == "grpo":
        return GRPOTrainer

    class ReinforcePlusPlusTrainer(GRPOTrainer):
        """GRPOTrainer with REINFORCE++ advantages: each reward minus the mean of the whole
        (global) batch, divided by the batch's standard deviation; no per-prompt baseline.

        TRL 1.12 computes GRPO's group advantages inline in ``_generate_and_score_completions``
        with no hook, so this keeps the gathered rewards from ``_calculate_rewards`` and
        replaces the advantages after it returns (before TRL shuffles and splits the batch).
        Both are private methods: trl is pinned, and a test checks the advantages.
        """

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions,
                                                 completion_ids_list)
            self._gathered_rewards = rewards  # (global batch, reward functions)
            return rewards

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            per_function = self._gathered_rewards
            weights = self.reward_weights.to(per_function.device).unsqueeze(0)
            rewards = (per_function * weights).nansum(dim=1)
            rewards[torch.isnan(per_function).all(dim=1)] = torch.nan
            advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
            advantages = torch.nan_to_num(advantages, nan=0.0)
            n, rank = len(inputs), self.accelerator.process_index
            out["advantages"] = advantages[rank * n:(rank + 1) * n]
            return out

    return ReinforcePlusPlusTrainer
