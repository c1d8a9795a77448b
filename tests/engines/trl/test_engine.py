"""The trl engine on CPU with a tiny model made here: it learns, it resumes, REINFORCE++
advantages, and its preflight."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import TrainerCallback

from rl_pipeline.engines.base import BAND_MAX, BAND_MIN, BAND_STD
from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.trl.export import export_result
from rl_pipeline.engines.trl.inputs import prompts_dataset
from rl_pipeline.engines.trl.preflight import check_trl, plan_trl
from rl_pipeline.engines.trl.reinforce_pp import trainer_class
from rl_pipeline.engines.trl.train import train_trl
from rl_pipeline.params import ConfigError, RewardParams
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.training_result import TrainingResult
from rl_pipeline.training_rollouts import PREFIX
from tests.conftest import gsm8k_prompts

FAST = {"apply_lora": False, "num_generations": 8, "per_device_train_batch_size": 16,
        "max_completion_length": 16, "num_iterations": 1, "beta": 0.0, "epsilon": 0.2,
        "logging_steps": 1, "warmup_ratio": 0.0, "lr_scheduler_type": "constant", "seed": 0}


@pytest.fixture(scope="module")
def digit_reward(digit_reward_file) -> RewardParams:
    return RewardParams(custom_reward_function={"path": str(digit_reward_file),
                                                "name": "score"})


def _train(tmp_path: Path, model: Path, reward: RewardParams, callbacks=(), **params):
    """Train, then export as the train node does: (summary, exported folder, history)."""
    run = train_trl(TrlParams(**{**FAST, **params}), reward, gsm8k_prompts(32), None,
                    str(model), tmp_path / "checkpoints", callbacks=callbacks)
    return run.summary, export_result(run, tmp_path / "scratch"), run.history


def _rewards(checkpoints: Path) -> list[float]:
    state = json.loads((sorted(checkpoints.glob("checkpoint-*"),
                               key=lambda p: int(p.name.split("-")[1]))[-1]
                        / "trainer_state.json").read_text())
    return [h["reward"] for h in state["log_history"] if "reward" in h]


@pytest.mark.slow
@pytest.mark.parametrize("learning_rate", [1e-2, 1e-12], ids=["training", "disabled"])
def test_grpo_raises_the_mean_reward(tiny_model_dir, digit_reward, tmp_path,
                                     learning_rate) -> None:
    summary, adapter, history = _train(tmp_path, tiny_model_dir, digit_reward, max_steps=20,
                                       save_steps=20, learning_rate=learning_rate)
    rewards = _rewards(tmp_path / "checkpoints")
    assert summary["steps"] == 20 and len(rewards) == 20
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert first > 0.02  # the random policy already earns some reward
    improved = last > first + 0.2 and last > 2 * first
    # The same assertion must fail when the optimizer cannot move the weights.
    assert improved == (learning_rate > 1e-6), (first, last)
    assert (adapter / "model.safetensors").is_file()  # apply_lora false: the whole model
    # The reward curve's history: TRL's mean reward per step within the step's rewards.
    steps = [h for h in history if "reward" in h]
    assert len(steps) == 20
    for h in steps:
        assert h[BAND_MIN] - 1e-6 <= h["reward"] <= h[BAND_MAX] + 1e-6, h
        n = h[PREFIX + "count"]  # ours over the step's n rewards, TRL's with n - 1
        assert h[BAND_STD] == pytest.approx(h["reward_std"] * math.sqrt((n - 1) / n),
                                            abs=1e-6), h


# Killed in a child process with SIGKILL after step 3's update (checkpoint-2 is the newest).
_KILLED_RUN = """
import os, signal, sys
import pandas as pd
from transformers import TrainerCallback
from rl_pipeline.params import RewardParams
from rl_pipeline.engines.trl.train import train_trl
from rl_pipeline.params.trl import TrlParams

class KillAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            os.kill(os.getpid(), signal.SIGKILL)

model, reward, prompts, out, params = sys.argv[1:]
train_trl(TrlParams.model_validate_json(params),
          RewardParams(custom_reward_function={"path": reward, "name": "score"}),
          pd.read_parquet(prompts), None, model, out, callbacks=[KillAt()])
"""


@pytest.mark.slow
def test_a_killed_run_resumes_exactly_where_it_stopped(tiny_model_dir, digit_reward_file,
                                                       digit_reward, tmp_path) -> None:
    """SIGKILL mid-way, rerun: it ends at max_steps, each step run once, on the schedule of
    a run that was never interrupted."""
    import subprocess
    import sys

    settings = {"max_steps": 4, "save_steps": 2, "learning_rate": 1e-3, "apply_lora": True,
                "lora_rank": 4, "lora_alpha": 8, "lr_scheduler_type": "linear",
                "warmup_ratio": 0.25}
    uninterrupted, _, _ = _train(tmp_path / "whole", tiny_model_dir, digit_reward, **settings)

    prompts = tmp_path / "prompts.parquet"
    gsm8k_prompts(32).to_parquet(prompts)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(tiny_model_dir), str(digit_reward_file),
         str(prompts), str(tmp_path / "checkpoints"),
         TrlParams(**{**FAST, **settings}).model_dump_json()],
        capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint-*")) == \
        ["checkpoint-2"]

    class Steps(TrainerCallback):
        def __init__(self) -> None:
            self.done: list[int] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.done.append(state.global_step)

    steps = Steps()
    summary, adapter, _ = _train(tmp_path, tiny_model_dir, digit_reward, callbacks=[steps],
                                 **settings)
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 4
    assert steps.done == [3, 4]  # none redone, none skipped
    rates = _logged(tmp_path / "checkpoints", "learning_rate")
    assert list(rates) == [1, 2, 3, 4] and len(set(rates.values())) == 4  # warm-up, decay
    assert rates == pytest.approx(_logged(tmp_path / "whole" / "checkpoints", "learning_rate"))
    assert uninterrupted["steps"] == summary["steps"]
    assert (adapter / "adapter_config.json").is_file()
    assert not (adapter / "optimizer.pt").exists()  # the model, not the trainer's state
    record = TrainingResult.read(adapter)
    assert (record.kind, record.engine) == ("peft_adapter", "trl")
    assert record.run["lora"] is True and record.run["steps"] == 4

    # Run again: complete, so it trains no further (it used to go on to step 5 at rate 0).
    again = train_trl(TrlParams(**{**FAST, **settings}), digit_reward, gsm8k_prompts(32), None,
                      str(tiny_model_dir), tmp_path / "checkpoints", callbacks=[steps])
    assert (again.summary["steps"], again.summary["already_complete"]) == (4, True)
    assert steps.done == [3, 4]


@pytest.mark.slow
def test_a_run_resumed_between_two_generations_keeps_the_generation_schedule(
        tiny_model_dir, digit_reward, tmp_path) -> None:
    """num_iterations 3: completions are generated at steps 1 and 4 of a run never
    interrupted. Resumed from checkpoint-2, step 3 must generate (its completions were not
    saved) and step 4 again, as the whole run did; TRL's count of micro-steps restarted at
    0 on resume, and step 4 reused step 3's completions."""
    import shutil

    settings = {"max_steps": 4, "save_steps": 2, "num_iterations": 3, "apply_lora": True,
                "lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-3}
    _train(tmp_path / "whole", tiny_model_dir, digit_reward, **settings)
    # A step logs the rollouts' metrics only when its completions were generated (scored).
    generated = sorted(_logged(tmp_path / "whole" / "checkpoints", PREFIX + "count"))
    assert generated == [1, 4]
    (tmp_path / "checkpoints").mkdir()
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "checkpoint-2",
                    tmp_path / "checkpoints" / "checkpoint-2")
    summary, _, _ = _train(tmp_path, tiny_model_dir, digit_reward, **settings)
    assert (summary["resumed_from_step"], summary["steps"]) == (2, 4)
    assert sorted(_logged(tmp_path / "checkpoints", PREFIX + "count")) == [1, 3, 4]


@pytest.mark.slow
def test_weighted_terms_train_under_an_mlflow_run(tiny_model_dir, digit_reward_file,
                                                  mlflow_store, tmp_path) -> None:
    """TRL logs each reward function's time straight to the active MLflow run, named after
    the function: a name of two terms must be one MLflow takes (a "+" ended the first
    step)."""
    import mlflow

    reward = RewardParams.model_validate({"terms": [
        {"name": "score", "path": str(digit_reward_file), "label": "digits"},
        {"name": "well_formed", "weight": 0.1, "label": "format"}]})
    with mlflow.start_run() as run:
        trained = train_trl(TrlParams(**{**FAST, "max_steps": 1, "save_steps": 1}), reward,
                         gsm8k_prompts(16), None, str(tiny_model_dir), tmp_path / "checkpoints")
    assert trained.summary["steps"] == 1
    logged = mlflow.get_run(run.info.run_id).data.metrics
    assert "profiling/Time taken: GRPOTrainer.digits-format" in logged, sorted(logged)


def _logged(checkpoints: Path, key: str) -> dict[int, float]:
    newest = max(checkpoints.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((newest / "trainer_state.json").read_text())
    return {h["step"]: h[key] for h in state["log_history"] if key in h}


def test_reinforce_plus_plus_advantages_are_verls(tiny_model_dir, digit_reward,
                                                  tmp_path) -> None:
    """The trl engine's REINFORCE++ advantages are what verl's own estimator
    (``compute_reinforce_plus_plus_outcome_advantage``) gives for the same rewards and
    response masks: the reward on each response's last token, whitened over the batch's
    tokens."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_reinforce_plus_plus_outcome_advantage

    from rl_pipeline.engines.trl.config import grpo_config
    from rl_pipeline.engines.trl.inputs import TrlReward

    params = TrlParams(**{**FAST, "per_device_train_batch_size": 8, "num_generations": 4,
                          "algorithm_adv_estimator": "reinforce_plus_plus", "max_steps": 1})
    dataset = prompts_dataset(gsm8k_prompts(2))
    trainer = trainer_class("reinforce_plus_plus")(
        model=str(tiny_model_dir), reward_funcs=[TrlReward(digit_reward)],
        args=grpo_config(params, str(tmp_path), use_cpu=True), train_dataset=dataset)
    inputs = [dataset[i] for i in range(2) for _ in range(4)]
    out = trainer._generate_and_score_completions(inputs)
    # Independently of the trainer's reward path: decode what it generated and score it by
    # hand (the digit reward: the share of non-space characters that are digits).
    mask = out["completion_mask"]
    texts = [trainer.processing_class.decode(ids[m.bool()], skip_special_tokens=True)
             for ids, m in zip(out["completion_ids"], mask, strict=True)]
    chars = [[c for c in text if not c.isspace()] for text in texts]
    rewards = np.array([sum(c.isdigit() for c in cs) / len(cs) if cs else 0.0 for cs in chars])
    assert rewards.std() > 0, texts  # something to normalise
    lengths = mask.sum(dim=1)
    assert lengths.unique().numel() > 1, lengths  # responses of several lengths: they weigh
    token_rewards = torch.zeros(mask.shape, dtype=torch.float64)
    token_rewards[torch.arange(len(rewards)), lengths - 1] = torch.tensor(rewards)
    verl_advantages, _ = compute_reinforce_plus_plus_outcome_advantage(
        token_rewards, mask.double(), config=AlgoConfig(gamma=1.0))
    for row, n in enumerate(lengths.tolist()):  # one advantage over all of a response's tokens
        np.testing.assert_allclose(verl_advantages[row, :n].numpy(),
                                   out["advantages"][row].item(), atol=1e-4)
    # Not the per-response whitening (each response weighing 1), which it once was.
    per_response = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4)
    assert np.abs(out["advantages"].double().numpy() - per_response).max() > 1e-3


def test_an_eval_strategy_with_do_eval_left_false_evaluates(tiny_model_dir, digit_reward,
                                                            tmp_path) -> None:
    """The spec: do_eval "will be set to True if eval_strategy is different from 'no'".
    GRPOConfig did, but the engine passed no eval set, and the trainer raised "You have set
    args.eval_strategy to IntervalStrategy.STEPS but you didn't pass an eval_dataset"."""
    run = train_trl(TrlParams(**{**FAST, "per_device_train_batch_size": 4, "num_generations": 4,
                                 "max_steps": 2, "eval_strategy": "steps", "eval_steps": 2,
                                 "per_device_eval_batch_size": 4}),
                    digit_reward, gsm8k_prompts(8), gsm8k_prompts(4), str(tiny_model_dir),
                    tmp_path / "checkpoints")
    assert run.summary["steps"] == 2
    state = json.loads((tmp_path / "checkpoints" / "checkpoint-2" / "trainer_state.json")
                       .read_text())
    assert any(key.startswith("eval_") for entry in state["log_history"] for key in entry)


def test_a_checkpoint_given_to_resume_must_have_steps_left(tiny_model_dir, digit_reward,
                                                            tmp_path) -> None:
    """train.resume=<checkpoint-6> with max_steps 6 took a 7th step and exported it."""
    from rl_pipeline.params import ConfigError

    small = {**FAST, "per_device_train_batch_size": 4, "num_generations": 4, "save_steps": 1}
    train_trl(TrlParams(**{**small, "max_steps": 2}), digit_reward, gsm8k_prompts(8), None,
              str(tiny_model_dir), tmp_path / "first")
    done = tmp_path / "first" / "checkpoint-2"
    with pytest.raises(ConfigError, match=r"is at step 2, and train.trl.max_steps=2: nothing "
                                          r"is left to train"):
        train_trl(TrlParams(**{**small, "max_steps": 2}), digit_reward, gsm8k_prompts(8), None,
                  str(tiny_model_dir), tmp_path / "again", resume=str(done))
    more = train_trl(TrlParams(**{**small, "max_steps": 3}), digit_reward, gsm8k_prompts(8),
                     None, str(tiny_model_dir), tmp_path / "more", resume=str(done))
    assert (more.summary["steps"], more.summary["resumed_from_step"]) == (3, 2)


def test_rollouts_decode_with_the_kv_cache(tiny_model_dir, digit_reward, tmp_path) -> None:
    # Without the cache every new token re-reads the whole sequence (12x slower on SmolLM2).
    from rl_pipeline.engines.trl.config import grpo_config
    from rl_pipeline.engines.trl.inputs import TrlReward

    params = TrlParams(**{**FAST, "per_device_train_batch_size": 4, "num_generations": 4,
                          "max_steps": 1})
    dataset = prompts_dataset(gsm8k_prompts(1))
    trainer = trainer_class("grpo")(
        model=str(tiny_model_dir), reward_funcs=[TrlReward(digit_reward)],
        args=grpo_config(params, str(tmp_path), use_cpu=True), train_dataset=dataset)
    lengths = []
    trainer.model.register_forward_pre_hook(
        lambda _, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    trainer._generate_and_score_completions([dataset[0]] * 4)
    decode_steps = [n for n in lengths if n == 1]
    assert len(decode_steps) >= params.max_completion_length // 2, lengths


def test_the_reward_learns_from_trl_how_each_completion_ended(tiny_model_dir,
                                                               tmp_path) -> None:
    """TRL gives completion ids; a completion without end-of-sequence that fills the cap is
    truncated, and gsm8k_format_credit then withholds its format credit."""
    from transformers import AutoTokenizer

    from rl_pipeline.engines.trl.inputs import TrlReward

    eos = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    reward = TrlReward(RewardParams(custom_reward_function={"name": "gsm8k_format_credit"}),
                       stop_ids=(eos, None), max_completion_length=4)
    wrong = [{"role": "assistant", "content": "She had 70. #### 70"}]
    scores = reward(prompts=[[]] * 3, completions=[wrong] * 3,
                    data_source=["openai/gsm8k"] * 3, ground_truth=["72"] * 3,
                    extra_info=["{}"] * 3,
                    completion_ids=[[5, 6, eos], [5, 6, 7, 8], [5, 6, 7, eos]])
    assert scores == [0.1, 0.0, 0.1]  # ended; cut at the cap of 4; ended at the cap
    # In GRPOTrainer, from TRL's own completion ids: a reward that pays for truncation is
    # paid exactly for the completions that fill the cap without end-of-sequence.
    from rl_pipeline.engines.trl.config import grpo_config

    truncation = tmp_path / "truncation.py"
    truncation.write_text("def score(data_source, solution_str, ground_truth, extra_info):\n"
                          "    return float(extra_info['truncated'])\n")
    params = TrlParams(**{**FAST, "per_device_train_batch_size": 8, "num_generations": 8,
                          "max_steps": 1})
    dataset = prompts_dataset(gsm8k_prompts(1))
    paid = RewardParams(custom_reward_function={"path": str(truncation), "name": "score"})
    trainer = trainer_class("grpo")(
        model=str(tiny_model_dir), args=grpo_config(params, str(tmp_path), use_cpu=True),
        train_dataset=dataset, reward_funcs=[TrlReward(paid, (eos, None), 16)])
    out = trainer._generate_and_score_completions([dataset[0]] * 8)
    ids, mask = out["completion_ids"], out["completion_mask"]
    lengths = mask.sum(dim=1)
    expected = [float(n == 16 and ids[i, n - 1] != eos) for i, n in enumerate(lengths.tolist())]
    mode = "train" if trainer.model.training else "eval"  # how TRL files the metrics
    assert trainer._metrics[mode]["rewards/score/mean"][-1] == pytest.approx(
        sum(expected) / len(expected))


def test_trl_preflight_names_every_problem(tiny_model_dir, tmp_path) -> None:
    frame = gsm8k_prompts(4)
    train_file = tmp_path / "train.parquet"
    frame.to_parquet(train_file)
    broken = tmp_path / "broken.py"
    broken.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    raise KeyError('answer')\n")
    params = TrlParams(per_device_train_batch_size=6, num_generations=4)
    reward = RewardParams(custom_reward_function={"path": str(broken), "name": "score"})
    with pytest.raises(PreflightError) as err:
        plan_trl(params, reward, str(train_file), str(tiny_model_dir), str(tmp_path), 4)
    message = str(err.value)
    assert "train.trl.num_generations=4: a divisor of the effective batch 6" in message
    assert "GRPOConfig" not in message  # TRL's own words for the same rule, not twice
    # The reward self-test names the data source, the reward's file and what it raised.
    assert "data_prep.data_source='openai/gsm8k': reward self-test failed" in message
    assert f"score from {broken}" in message and "KeyError" in message
    # A typo in the LoRA targets: peft raised it with a traceback at the forecast, or at the
    # first step with the forecast off.
    with pytest.raises(PreflightError) as err:
        plan_trl(TrlParams(lora_target_modules=["q_proj", "nope_proj"]), RewardParams(),
                 str(train_file), str(tiny_model_dir), str(tmp_path), 4)
    assert str(err.value).endswith(
        "train.trl.lora_target_modules=['q_proj', 'nope_proj']: names of the model's modules: "
        f"no module of {tiny_model_dir} is named 'nope_proj'; its linear layers: down_proj, "
        "gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (or all-linear)")
    report, config_yaml = plan_trl(TrlParams(), RewardParams(), str(train_file),
                                   str(tiny_model_dir), str(tmp_path), 4)
    assert report["reward"]["openai/gsm8k"]["gold_correct"] == 1.0
    assert "num_generations: 4" in config_yaml and "r: 16" in config_yaml
    # The config that trains (it said report_to: [] where training reported to MLflow).
    resolved = yaml.safe_load(config_yaml)["grpo_config"]
    assert (resolved["report_to"], resolved["save_strategy"]) == (["mlflow"], "steps")


def test_trl_rules_and_estimators() -> None:
    assert check_trl(TrlParams(), train_rows=100) == []
    names = [p.parameter for p in check_trl(TrlParams(per_device_train_batch_size=3), 100)]
    assert names == ["num_generations"]
    assert [p.parameter for p in check_trl(TrlParams(), train_rows=1)] == \
        ["per_device_train_batch_size"]
    with pytest.raises(ConfigError, match=r"train.trl.algorithm_adv_estimator='gae'.*verl"):
        TrlParams.model_validate({"algorithm_adv_estimator": "gae"})
