"""The verl engine's preflight with real inputs: verl's Hydra config, its validate_config,
its RLHFDataset on our parquet, and its reward manager on our reward; a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl.config import LaunchInputs
from rl_pipeline.engines.verl.engine import tracking_uri_for_workers
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.engines.verl.preflight import GPUsNeededError
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.verl_inputs import SMALL

# Slow: verl's whole configuration composed and checked (plan_verl) with the tiny model.
pytestmark = pytest.mark.slow


def _plan(inputs, verl=None, reward=None, **kwargs):
    return plan_verl(VerlParams(**{**SMALL, **(verl or {})}), DataParams(),
                     reward or RewardParams(), inputs,
                     **{"gpus_visible": 0, "training": False, "train_rows": 16, **kwargs})


def test_plan_composes_checks_and_wires_the_catalog(inputs) -> None:
    plan = _plan(inputs, {"pypi_packages_override": "transformers==5.10.4, peft>=0.17"})
    config = plan.config
    assert config.data.train_files == inputs.train_files
    assert config.actor_rollout_ref.model.path == inputs.model_path
    assert config.trainer.default_local_dir == inputs.checkpoints_dir
    assert config.trainer.resume_mode == "auto"
    assert list(config.trainer.logger) == ["console", "mlflow"]
    assert config.reward.custom_reward_function.path == "pkg://rl_pipeline.rewards.scoring"
    # verl loads our reward manager, which tells the reward how each response ended.
    assert (config.reward.reward_manager.source, config.reward.reward_manager.name) == \
        ("importlib", "ResponseFactsRewardManager")
    runtime_env = config.ray_kwargs.ray_init.runtime_env
    assert runtime_env.env_vars.MLFLOW_TRACKING_URI == inputs.tracking_uri
    assert list(runtime_env.pip) == ["transformers==5.10.4", "peft>=0.17"]
    assert not config.critic.get("enable")
    # The reward self-test, through verl's reward path: golds 1, wrong answers lower.
    assert plan.report["reward"]["openai/gsm8k"]["gold_correct"] == 1.0
    assert plan.report["reward"]["openai/gsm8k"]["wrong_below_gold"] == 1.0
    assert plan.report["prompts"]["train_prompts"]["rows_checked"] == 16
    assert plan.command.startswith("python -m verl.trainer.main_ppo ")


def test_gae_configures_a_critic_on_the_same_model(inputs) -> None:
    config = _plan(inputs, {"algorithm_adv_estimator": "gae"}).config
    assert config.critic.model.path == inputs.model_path
    assert config.critic.ppo_micro_batch_size_per_gpu == SMALL["actor_ppo_micro_batch_size_per_gpu"]
    # The critic is built like the actor, with the attention kernel we configure.
    assert config.critic.model.override_config.attn_implementation == "sdpa"
    assert config.trainer.use_v1


def test_remax_runs_on_verls_legacy_trainer(inputs) -> None:
    """verl's v1 trainer calls the remax advantage without the greedy baselines only its legacy
    trainer generates (tests/gpu_boundary/test_advantages.py runs both paths)."""
    config = _plan(inputs, {"algorithm_adv_estimator": "remax"}).config
    assert config.trainer.use_v1 is False
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"


def test_extra_overrides_are_composed_and_checked_together(inputs) -> None:
    config = _plan(inputs, {"overrides": ["trainer.max_critic_ckpt_to_keep=2"]}).config
    assert config.trainer.max_critic_ckpt_to_keep == 2
    with pytest.raises(PreflightError) as err:
        _plan(inputs, {"overrides": ["trainer.no_such_key=1", "data.train_batch_size=4",
                                     "trainer.default_local_dir=/tmp/x", "not an override"]})
    message = str(err.value)
    assert "train.verl.overrides='trainer.no_such_key=1'" in message
    assert "is set by train.verl.data_train_batch_size" in message
    assert "trainer.default_local_dir is set by the catalog" in message
    assert "'key=value'" in message
    assert len(err.value.problems) == 4


def test_a_reward_that_raises_fails_preflight_naming_it(inputs, tmp_path) -> None:
    broken = tmp_path / "broken_reward.py"
    broken.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 1 / 0\n")
    reward = RewardParams(custom_reward_function={"path": str(broken), "name": "score"})
    with pytest.raises(PreflightError, match=r"data_prep.data_source='openai/gsm8k': reward "
                                             r"self-test failed.*ZeroDivisionError"):
        _plan(inputs, reward=reward)


def test_verls_reward_manager_tells_the_reward_how_each_response_ended(inputs) -> None:
    """Through verl's own load_reward_manager and reward loop call: a wrong answer earns the
    format credit when it ended (EOS, or short of the cap), nothing when the cap cut it."""
    import numpy as np
    import torch
    from omegaconf import open_dict
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    config = _plan(inputs, reward=RewardParams(
        custom_reward_function={"name": "gsm8k_format_credit"})).config
    tokenizer = AutoTokenizer.from_pretrained(inputs.model_path)
    reply = tokenizer("She had 70. #### 70", add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id or 0
    row = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"},
           "extra_info": {"split": "train", "index": 0}}

    def score(responses: list[int], valid: int, cap: int) -> float:
        checked = config.copy()
        with open_dict(checked):
            checked.data.max_response_length = cap
        manager = load_reward_manager(checked, tokenizer)
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([[5, 6]]), "responses": torch.tensor([responses]),
                     "attention_mask": torch.tensor([[1, 1] + [1] * valid
                                                     + [0] * (len(responses) - valid)])},
            non_tensors={k: np.array([v], dtype=object) for k, v in row.items()})
        return manager.loop.run_until_complete(manager.run_single(data))["reward_score"]

    n = len(reply)
    assert score(reply + [pad] * 4, n, n + 4) == 0.1  # short of the cap: ended
    assert score(reply + [eos], n + 1, n + 1) == 0.1  # EOS as the last token of the cap
    assert score(reply, n, n) == 0.0  # the cap cut it off


def test_a_lora_target_the_model_lacks_is_named_with_those_it_has(inputs) -> None:
    """peft raised it with a traceback after "verl preflight passed", at the forecast or at
    the first step on the GPUs. (Which targets pass: tests/models/test_facts.py.)"""
    with pytest.raises(PreflightError, match=r"train.verl.actor_model_target_modules="
                                             r"\['q_proj', 'nope_proj'\]: names of the model's "
                                             r"modules: no module of .* is named 'nope_proj'; "
                                             r"its linear layers: down_proj, gate_proj"):
        _plan(inputs, {"actor_model_target_modules": "[q_proj,nope_proj]"})
    # A YAML list, as users write lists, reaches verl as its list.
    assert list(_plan(inputs, {"actor_model_target_modules": ["q_proj", "v_proj"]}).config
                .actor_rollout_ref.model.target_modules) == ["q_proj", "v_proj"]


def test_data_longer_than_the_limit_is_named(inputs) -> None:
    with pytest.raises(PreflightError, match=r"data.data_max_prompt_length=16: at least the "
                                             r"longest prompt of train_prompts"):
        plan_verl(VerlParams(**SMALL), DataParams(data_max_prompt_length=16,
                                                  data_filter_overlong_prompts=False),
                  RewardParams(), inputs, gpus_visible=0, training=False, train_rows=16)


def test_a_file_verl_cannot_read_is_named(inputs, tmp_path) -> None:
    bad = tmp_path / "not.parquet"
    bad.write_text("no parquet here")
    wrong = LaunchInputs(**{**vars(inputs), "train_files": str(bad)})
    with pytest.raises(PreflightError, match=r"catalog.train_prompts=.*RLHFDataset"):
        _plan(wrong)


def test_training_without_gpus_stops_first_with_one_message(inputs) -> None:
    with pytest.raises(GPUsNeededError) as err:
        plan_verl(VerlParams(), DataParams(), RewardParams(), inputs, gpus_visible=0,
                  training=True)
    message = str(err.value)
    assert "verl needs 8 CUDA GPU(s)" in message and "has 0" in message
    assert "train.engine: trl" in message


def test_auto_resolves_on_this_machine_and_is_reported(inputs) -> None:
    plan = _plan(inputs, {"trainer_n_gpus_per_node": "auto",
                          "rollout_tensor_model_parallel_size": "auto"})
    assert plan.report["hardware"] == {"gpus_per_node": 1, "nnodes": 1, "tensor_parallel": 1,
                                       "device": "cuda"}
    assert plan.config.trainer.n_gpus_per_node == 1


def test_relative_tracking_uris_are_made_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert tracking_uri_for_workers("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert tracking_uri_for_workers("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert tracking_uri_for_workers("http://host:5000") == "http://host:5000"


def test_resolved_config_is_yaml_verl_can_read(inputs) -> None:
    from rl_pipeline.engines.verl.plan import resolved_config_yaml

    text = resolved_config_yaml(_plan(inputs))
    assert OmegaConf.create(text).data.train_batch_size == SMALL["data_train_batch_size"]


# ------------------------------------------------------------------ run identity and resume


@pytest.mark.parametrize(("resume", "mode", "path"), [
    ("auto", "auto", None), ("never", "disable", None),
    ("/runs/x/global_step_4", "resume_path", "/runs/x/global_step_4")])
def test_train_resume_sets_verls_resume_keys(inputs, resume, mode, path) -> None:
    from dataclasses import replace

    config = _plan(replace(inputs, resume=resume)).config
    assert (config.trainer.resume_mode, config.trainer.resume_from_path) == (mode, path)
    assert config.trainer.default_local_dir == inputs.checkpoints_dir


def test_verls_resume_keys_are_set_by_train_resume_only(inputs) -> None:
    with pytest.raises(PreflightError) as failure:
        _plan(inputs, {"overrides": ["trainer.resume_mode=disable",
                                     "trainer.default_local_dir=/elsewhere"]})
    message = str(failure.value)
    assert "'trainer.resume_mode=disable': a key no parameter sets" in message
    assert "'trainer.default_local_dir=/elsewhere': a key no parameter sets" in message
    # One that repeats the launch's own value says nothing new: dropped, not refused.
    assert _plan(inputs, {"overrides": ["trainer.resume_mode=auto"]}).config.trainer.\
        resume_mode == "auto"
    # The rollout's length is the data's caps (within the tiny model's 2,048 positions).
    with pytest.raises(PreflightError, match=r"'actor_rollout_ref.rollout.max_model_len=4096'"
                                             r": a key no parameter sets: .* is set by "
                                             r"data.data_max_prompt_length \+ data.data_max_"
                                             r"response_length"):
        _plan(inputs, {"overrides": ["actor_rollout_ref.rollout.max_model_len=4096"]})
    assert _plan(inputs).config.actor_rollout_ref.rollout.max_model_len == 2048


def test_verl_checkpoints_go_to_the_folder_of_the_run_identity(inputs, tmp_path) -> None:
    """verl's default_local_dir is one folder per identity: another learning rate, another
    folder; the same configuration, the same folder."""
    from rl_pipeline.params.train import TrainParams
    from rl_pipeline.pipelines.preflight.nodes import check_training_setup

    root = tmp_path / "train_checkpoints"

    def checked(**verl):
        train = TrainParams(engine="verl", verl=VerlParams(**{**SMALL, **verl}))
        plan, report, config_yaml, _, _ = check_training_setup(
            inputs.train_files, inputs.val_files, inputs.model_path, str(root), train,
            DataParams(), RewardParams())
        config = OmegaConf.create(config_yaml)
        assert config.trainer.default_local_dir == report["checkpoints"]
        assert plan["identity"] == report["identity"]
        return report["checkpoints"]

    first = checked()
    assert Path(first).parent == root and len(Path(first).name) == 12
    assert checked(actor_optim_lr=2e-6) != first


def test_total_training_steps_overrides_the_epochs_verl_would_stop_at(inputs) -> None:
    """verl 0.9.1 stops at whichever comes first, its epochs or its steps: 30 steps of 2 per
    epoch in 7 epochs would end at step 14, short of the last step it saves. verl is given
    the epochs the steps need (the real loop runs them: test_cpu.py's one-rank run trains 5
    steps of 4 prompts out of 16 with one epoch set)."""
    assert _plan(inputs).config.trainer.total_epochs == 7
    for steps, epochs in ((30, 15), (14, 7), (3, 2), (1, 1)):
        config = _plan(inputs, {"total_training_steps": steps}).config
        assert (config.trainer.total_training_steps, config.trainer.total_epochs) == (
            steps, epochs)
        assert 16 // 8 * config.trainer.total_epochs >= steps


def _verl_checkpoints(folder: Path, steps: list[int]) -> Path:
    """verl's checkpoint layout as its trainer leaves it (global_step_N/actor and the tracker
    file naming the newest)."""
    for step in steps:
        (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(max(steps)))
    return folder


def test_the_step_count_check_reads_verls_checkpoint_layout(inputs, tmp_path) -> None:
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    from rl_pipeline.engines.verl.engine import check_step_count
    from rl_pipeline.engines.verl.plan import planned_steps

    folder = _verl_checkpoints(tmp_path / "ckpt", [5, 10])
    assert find_latest_ckpt_path(str(folder)) == str(folder / "global_step_10")  # verl's reader
    config = _plan(inputs).config
    # 16 prompts in batches of 8, 7 epochs (verl's own count); total_training_steps wins.
    assert planned_steps(config) == 16 // 8 * 7 == 14
    assert planned_steps(_plan(inputs, {"total_training_steps": 10}).config) == 10
    check_step_count(folder, planned=10, resumed_from=5)
    # verl issue #7401: resumed at an epoch boundary, it skipped an epoch and exited 0.
    with pytest.raises(RuntimeError) as failure:
        check_step_count(folder, planned=14, resumed_from=5)
    assert ("verl planned 14 steps and, resumed from step 5, its newest checkpoint in "
            f"{folder} is step 10: +4 steps were not run (verl issue #7401") in str(failure.value)


def test_a_complete_verl_run_trains_no_further(inputs, tmp_path) -> None:
    """No Ray, no verl driver: the checkpoints already hold the planned last step."""
    from dataclasses import replace

    from rl_pipeline.engines.verl.engine import train_verl

    folder = _verl_checkpoints(tmp_path / "ckpt", [10])
    plan = _plan(replace(inputs, checkpoints_dir=str(folder)), {"total_training_steps": 10})
    run = train_verl(plan.overrides, run_id=None)
    assert (run.summary["already_complete"], run.summary["steps"]) == (True, 10)
    assert run.checkpoints == folder
