"""verl's advantage estimators, through the entry point of the trainer we launch for each.

The boundary: the advantages verl computes on the driver between rollout and actor update.
For eight estimators that is the V1 trainer (``trainer.use_v1=true``): its
``PPOTrainer._compute_advantage`` calls ``compute_advantage_for_multi_trajectories``. For
remax it is the legacy ``RayPPOTrainer`` (``trainer.use_v1=false``), whose ``fit`` builds
``reward_baselines`` from a greedy rollout and calls ``ray_trainer.compute_advantage``; the
V1 trainer never builds them, and the last test pins the failure that causes.

Each estimator runs on one synthetic rollout (3 prompts x 4 responses, outcome rewards on the
last response token, responses of different lengths, rows out of group order) and is checked
against its definition, computed here with numpy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from rl_pipeline.engines.verl.config import compose_verl_config, hydra_overrides, spec_values
from rl_pipeline.params import DataParams
from rl_pipeline.params.verl import ADV_ESTIMATORS, VerlParams

if TYPE_CHECKING:
    from verl.protocol import DataProto

pytestmark = pytest.mark.gpu_boundary

# Estimators we launch on the legacy trainer; the rest run on the V1 trainer.
LEGACY = frozenset({"remax"})

PROMPTS, SAMPLES, WIDTH = 3, 4, 6
# Outcome reward of each response, one row per prompt. Prompt 1 ties at the top (pass@k then
# credits nobody); prompt 2 has one nonzero reward (GPG counts nonzero rewards batch-wide).
REWARDS = np.array([[1.0, 0.0, 0.5, 0.0], [0.2, 0.9, 0.9, 0.4], [0.0, 0.0, 0.0, 1.0]])
LENGTHS = np.array([[6, 2, 4, 3], [5, 6, 1, 2], [3, 4, 6, 5]])
GREEDY = np.array([0.5, 0.9, 0.0])  # ReMax: reward of each prompt's greedy response
# Rows out of group order, as after the legacy trainer's _balance_batch: verl groups by uid.
ORDER = np.array([5, 0, 11, 2, 7, 9, 1, 4, 10, 3, 8, 6])
GAMMA, LAM = 0.9, 0.8  # not 1.0, so discounting and the GAE trace show in the numbers
GROUP_EPS = 1e-6  # verl's epsilon added to a group's std
WHITEN_EPS = 1e-8  # verl_F.masked_whiten's epsilon added to the variance


@dataclass(frozen=True)
class Rollout:
    """One padded batch, a row per response."""

    uid: np.ndarray  # prompt id of each row (object array of str)
    session: np.ndarray  # index of the response within its prompt's group
    reward: np.ndarray  # outcome reward
    length: np.ndarray  # valid response tokens
    baseline: np.ndarray  # greedy reward of the row's prompt (ReMax)
    values: np.ndarray  # critic values (GAE); junk beyond each response

    @property
    def mask(self) -> np.ndarray:
        return (np.arange(WIDTH)[None, :] < self.length[:, None]).astype(np.int64)

    @property
    def scores(self) -> np.ndarray:
        """Token-level scores: the reward on the last valid token, as verl's agent loop puts it."""
        out = np.zeros((len(self.reward), WIDTH))
        out[np.arange(len(self.reward)), self.length - 1] = self.reward
        return out


def _rollout() -> Rollout:
    prompt = np.repeat(np.arange(PROMPTS), SAMPLES)
    values = np.random.default_rng(0).normal(size=(PROMPTS * SAMPLES, WIDTH))
    return Rollout(
        uid=np.array([f"prompt-{p}" for p in prompt], dtype=object)[ORDER],
        session=np.tile(np.arange(SAMPLES), PROMPTS)[ORDER],
        reward=REWARDS.reshape(-1)[ORDER], length=LENGTHS.reshape(-1)[ORDER],
        baseline=GREEDY[prompt][ORDER], values=values[ORDER])


@pytest.fixture(scope="module")
def verl_config() -> DictConfig:
    """verl's composed config with our spec defaults, as the trainer receives it."""
    values = spec_values(VerlParams(rollout_n=SAMPLES), DataParams())
    paths = ["data.train_files=/data/train.parquet", "data.val_files=/data/val.parquet",
             "actor_rollout_ref.model.path=/models/base"]
    return compose_verl_config(hydra_overrides(
        values, [*paths, f"algorithm.gamma={GAMMA}", f"algorithm.lam={LAM}"]))


def _with_estimator(config: DictConfig, estimator: str) -> DictConfig:
    config = copy.deepcopy(config)
    config.algorithm.adv_estimator = estimator
    # The trainers copy scores to rewards unchanged only without the in-reward KL penalty.
    assert not config.algorithm.use_kl_in_reward
    return config


def _trainer_kwargs(config: DictConfig) -> dict[str, Any]:
    """The arguments both trainers pass to their advantage entry point."""
    algorithm = config.algorithm
    return {"adv_estimator": algorithm.adv_estimator, "gamma": algorithm.gamma,
            "lam": algorithm.lam, "num_repeat": config.actor_rollout_ref.rollout.n,
            "norm_adv_by_std_in_grpo": algorithm.get("norm_adv_by_std_in_grpo", True),
            "config": algorithm}


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.tensor(array, dtype=torch.float32)


def v1_advantages(rollout: Rollout, config: DictConfig) -> DataProto:
    """As the V1 trainer's ``PPOTrainer._compute_advantage`` does once TransferQueue has
    handed it the padded fields (it fetches uid, response_mask, rm_scores, log-probs and
    values, never reward_baselines)."""
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1 import trainer_base

    rm_scores = _tensor(rollout.scores)
    data = DataProto(batch=TensorDict({
        "response_mask": torch.tensor(rollout.mask), "rm_scores": rm_scores,
        "old_log_probs": torch.zeros_like(rm_scores), "values": _tensor(rollout.values),
    }, batch_size=[len(rollout.reward)]))
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = rollout.uid
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    # TransferQueue keys: {uid}_{session_id}_{index of the agent loop's output}.
    keys = [f"{u}_{s}_0" for u, s in zip(rollout.uid, rollout.session, strict=True)]
    return trainer_base.compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, **_trainer_kwargs(config))


def legacy_advantages(rollout: Rollout, config: DictConfig) -> DataProto:
    """As the legacy ``RayPPOTrainer.fit`` does: the greedy reward of each prompt, repeated to
    its responses, rides along as ``reward_baselines``."""
    from verl.protocol import DataProto
    from verl.trainer.ppo import ray_trainer

    scores = _tensor(rollout.scores)
    data = DataProto.from_dict(
        tensors={"response_mask": torch.tensor(rollout.mask),
                 "reward_baselines": _tensor(rollout.baseline),
                 "old_log_probs": torch.zeros_like(scores), "values": _tensor(rollout.values),
                 "token_level_scores": scores, "token_level_rewards": scores},
        non_tensors={"uid": rollout.uid})
    return ray_trainer.compute_advantage(data, **_trainer_kwargs(config))


# --- The definitions, in numpy --------------------------------------------------------------

Expected = tuple[np.ndarray, np.ndarray | None]  # advantages, returns (None: not checked)


def _groups(rollout: Rollout) -> dict[str, np.ndarray]:
    return {u: np.flatnonzero(rollout.uid == u) for u in np.unique(rollout.uid)}


def _per_row(rollout: Rollout, advantage: np.ndarray) -> np.ndarray:
    """An outcome advantage on every valid token of its response."""
    return advantage[:, None] * rollout.mask


def _whiten(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Batch whitening over the valid tokens (every token counts once, unbiased variance)."""
    valid = x[mask.astype(bool)]
    return (x - valid.mean()) / np.sqrt(valid.var(ddof=1) + WHITEN_EPS)


def _grpo(r: Rollout) -> Expected:
    adv = np.zeros_like(r.reward)
    for rows in _groups(r).values():
        g = r.reward[rows]
        adv[rows] = (g - g.mean()) / (g.std(ddof=1) + GROUP_EPS)
    return _per_row(r, adv), None


def _rloo(r: Rollout) -> Expected:
    adv = np.zeros_like(r.reward)
    for rows in _groups(r).values():
        g = r.reward[rows]
        adv[rows] = g - (g.sum() - g) / (len(g) - 1)  # minus the mean of the others
    return _per_row(r, adv), None


def _opo(r: Rollout) -> Expected:
    adv = np.zeros_like(r.reward)
    for rows in _groups(r).values():
        g, n = r.reward[rows], r.length[rows]
        adv[rows] = g - (n * g).sum() / n.sum()  # baseline: length-weighted group mean
    return _per_row(r, adv), None


def _gpg(r: Rollout) -> Expected:
    alpha = len(r.reward) / np.count_nonzero(r.reward)  # batch size / nonzero rewards
    adv = np.zeros_like(r.reward)
    for rows in _groups(r).values():
        adv[rows] = alpha * (r.reward[rows] - r.reward[rows].mean())  # f_norm = 1
    return _per_row(r, adv), None


def _grpo_passk(r: Rollout) -> Expected:
    """Only a group's best response gets credit: (best - second best) / (group std + eps)."""
    adv = np.zeros_like(r.reward)
    for rows in _groups(r).values():
        g = r.reward[rows]
        best, second = np.sort(g)[::-1][:2]
        adv[rows[np.argmax(g)]] = (best - second) / (g.std(ddof=1) + GROUP_EPS)
    return _per_row(r, adv), None


def _reinforce_plus_plus(r: Rollout) -> Expected:
    steps_to_end = r.length[:, None] - 1 - np.arange(WIDTH)[None, :]
    returns = r.reward[:, None] * GAMMA ** np.clip(steps_to_end, 0, None) * r.mask
    return _whiten(returns, r.mask) * r.mask, returns


def _reinforce_plus_plus_baseline(r: Rollout) -> Expected:
    centred = np.zeros_like(r.reward)
    for rows in _groups(r).values():
        centred[rows] = r.reward[rows] - r.reward[rows].mean()
    adv = _per_row(r, centred)
    return _whiten(adv, r.mask) * r.mask, None


def _remax(r: Rollout) -> Expected:
    return _per_row(r, r.reward - r.baseline), _per_row(r, r.reward)


def _gae(r: Rollout) -> Expected:
    adv = np.zeros((len(r.reward), WIDTH))
    scores = r.scores
    for i, n in enumerate(r.length):
        running = 0.0
        for t in reversed(range(n)):
            next_value = r.values[i, t + 1] if t + 1 < n else 0.0  # nothing after the last token
            delta = scores[i, t] + GAMMA * next_value - r.values[i, t]
            running = delta + GAMMA * LAM * running
            adv[i, t] = running
    return _whiten(adv, r.mask), adv + r.values


EXPECTED: dict[str, Callable[[Rollout], Expected]] = {
    "gae": _gae, "grpo": _grpo, "reinforce_plus_plus": _reinforce_plus_plus,
    "reinforce_plus_plus_baseline": _reinforce_plus_plus_baseline, "remax": _remax,
    "rloo": _rloo, "opo": _opo, "grpo_passk": _grpo_passk, "gpg": _gpg,
}


def _valid(x: torch.Tensor | np.ndarray, mask: np.ndarray) -> torch.Tensor:
    """The valid tokens only: beyond a response verl leaves some outputs (GAE) unmasked."""
    return torch.as_tensor(np.asarray(x, dtype=np.float64))[torch.tensor(mask, dtype=torch.bool)]


# --- Tests ----------------------------------------------------------------------------------

def test_every_estimator_of_ours_has_a_definition_here() -> None:
    assert set(EXPECTED) == set(ADV_ESTIMATORS)


def test_the_entry_points_are_what_the_trainers_call(verl_config: DictConfig) -> None:
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import get_trainer_cls, utils
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    # V1: the trainer for our trainer_mode keeps the base _compute_advantage, which calls
    # compute_advantage_for_multi_trajectories; that delegates non-GRPO estimators to
    # ray_trainer.compute_advantage.
    trainer_cls = get_trainer_cls(verl_config.trainer.v1.trainer_mode)
    assert trainer_cls._compute_advantage is PPOTrainer._compute_advantage
    called = PPOTrainer._compute_advantage.__code__.co_names
    assert "compute_advantage_for_multi_trajectories" in called
    assert utils.compute_advantage is ray_trainer.compute_advantage
    # Legacy: fit calls the module's compute_advantage.
    assert "compute_advantage" in ray_trainer.RayPPOTrainer.fit.__code__.co_names


@pytest.mark.parametrize("estimator", ADV_ESTIMATORS)
def test_the_launched_trainer_computes_the_estimators_advantages(
        estimator: str, verl_config: DictConfig) -> None:
    rollout = _rollout()
    config = _with_estimator(verl_config, estimator)
    entry = legacy_advantages if estimator in LEGACY else v1_advantages
    data = entry(rollout, config)
    advantages, returns = EXPECTED[estimator](rollout)

    got = data.batch["advantages"]
    assert got.shape == (PROMPTS * SAMPLES, WIDTH)
    torch.testing.assert_close(_valid(got, rollout.mask), _valid(advantages, rollout.mask),
                               rtol=1e-4, atol=1e-5)
    if estimator != "gae":  # outcome estimators put nothing past a response's end
        assert torch.all(got[torch.tensor(rollout.mask) == 0] == 0)
    if returns is not None:
        torch.testing.assert_close(_valid(data.batch["returns"], rollout.mask),
                                   _valid(returns, rollout.mask), rtol=1e-4, atol=1e-5)


def test_the_v1_trainer_cannot_compute_remax(verl_config: DictConfig) -> None:
    # The V1 trainer builds no greedy baseline and fetches no reward_baselines, so verl's
    # ReMax estimator is called without its required argument on the first training step.
    with pytest.raises(TypeError, match=r"compute_remax_outcome_advantage\(\) missing 1 "
                                        r"required positional argument: 'reward_baselines'"):
        v1_advantages(_rollout(), _with_estimator(verl_config, "remax"))
