"""REINFORCE++ on TRL: a GRPOTrainer subclass with REINFORCE++ advantages."""

from __future__ import annotations

import functools

import torch


@functools.cache
def trainer_class(estimator: str) -> type:
    """TRL's GRPOTrainer for ``grpo``; for ``reinforce_plus_plus`` a subclass with REINFORCE++
    advantages. Built on first use: importing trl takes seconds."""
    from trl import GRPOTrainer

    if estimator == "grpo":
        return GRPOTrainer

    class ReinforcePlusPlusTrainer(GRPOTrainer):
        """GRPOTrainer with verl's REINFORCE++ advantages (:func:`reinforce_pp_advantages`):
        no per-prompt baseline, the whole (global) batch's valid tokens whitened together.

        TRL 1.12 computes GRPO's group advantages inline in ``_generate_and_score_completions``
        with no hook, so this keeps the gathered rewards from ``_calculate_rewards`` and
        replaces the advantages after it returns (before TRL shuffles and splits the batch).
        Both are private methods: trl is pinned, and a test checks the advantages against
        verl's own function.
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
            lengths = self.accelerator.gather(out["completion_mask"].sum(dim=1))
            advantages = reinforce_pp_advantages(rewards, lengths.to(rewards.device))
            n, rank = len(inputs), self.accelerator.process_index
            out["advantages"] = advantages[rank * n:(rank + 1) * n]
            return out

    return ReinforcePlusPlusTrainer


def reinforce_pp_advantages(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """verl's REINFORCE++ advantage (``compute_reinforce_plus_plus_outcome_advantage``, gamma
    1, its default and ours) as one number per response, which is what TRL's loss takes.

    verl places each response's reward on its last token; with gamma 1 every valid token's
    return is that reward, and the returns are whitened over all valid tokens of the batch
    (``masked_whiten``: the token-weighted mean, the unbiased variance, ``rsqrt(var + 1e-8)``).
    So a response weighs in the batch's statistics by its length, and all its tokens get the
    same advantage. A response without a reward (NaN) or without tokens gets 0 and is left out
    of the statistics, as a masked token is in verl.

    Written here rather than calling verl's function: the trl engine does not need verl,
    and the test compares the two.
    """
    rewards, weight = rewards.double(), lengths.double()
    keep = ~torch.isnan(rewards) & (weight > 0)
    tokens = weight[keep].sum()
    out = torch.zeros_like(rewards)
    if tokens < 2:  # verl refuses fewer than two tokens: nothing to whiten
        return out.float()
    mean = (rewards[keep] * weight[keep]).sum() / tokens
    var = ((rewards[keep] - mean) ** 2 * weight[keep]).sum() / tokens * tokens / (tokens - 1)
    out[keep] = (rewards[keep] - mean) * torch.rsqrt(var + 1e-8)
    return out.float()
