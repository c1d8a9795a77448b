"""The run identity covers the reward's code, in whatever file or module it lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_pipeline.engines.base import TrainSetup
from rl_pipeline.engines.run_identity import RunIdentity, run_identity
from rl_pipeline.params import ConfigError, DataParams, RewardParams
from rl_pipeline.params.train import TrainParams

SCORE = ("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
         "    return {value}\n")


def _identity(tiny_model_dir: Path, tmp_path: Path, reward: dict) -> RunIdentity:
    prompts = tmp_path / "train.parquet"
    prompts.write_bytes(b"the prompts")
    setup = TrainSetup(str(prompts), str(prompts), str(tiny_model_dir), str(tmp_path),
                       TrainParams(engine="trl"), DataParams(),
                       RewardParams.model_validate(reward))
    return run_identity(setup, "trl")


def test_a_reward_terms_file_is_part_of_the_identity(tiny_model_dir, tmp_path) -> None:
    """Edit a term's file and the run is another run (its checkpoints are not resumed)."""
    term = tmp_path / "brevity.py"
    term.write_text(SCORE.format(value=1.0))
    reward = {"terms": [{"name": "compute_score"},
                        {"name": "score", "path": str(term), "weight": 0.5}]}
    first = _identity(tiny_model_dir, tmp_path, reward).fingerprint
    assert _identity(tiny_model_dir, tmp_path, reward).fingerprint == first
    term.write_text(SCORE.format(value=0.5))
    assert _identity(tiny_model_dir, tmp_path, reward).fingerprint != first
    # Built-in terms only: the identity is taken over what it was before term files counted.
    assert "terms_file_sha256" not in _identity(tiny_model_dir, tmp_path, {
        "terms": [{"name": "compute_score"}]}).inputs["reward"]


def test_a_deepspeed_config_files_content_is_part_of_the_identity(tiny_model_dir,
                                                                   tmp_path) -> None:
    """ZeRO-2 rewritten as ZeRO-3 with its own optimizer: the rerun resumed the old run's
    checkpoints, as the path was the same."""
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    prompts = tmp_path / "train.parquet"
    prompts.write_bytes(b"the prompts")

    def fingerprint() -> str:
        train = TrainParams.model_validate({"engine": "trl",
                                            "trl": {"deepspeed_config": str(config)}})
        setup = TrainSetup(str(prompts), str(prompts), str(tiny_model_dir), str(tmp_path),
                           train, DataParams(), RewardParams())
        return run_identity(setup, "trl").fingerprint

    first = fingerprint()
    assert fingerprint() == first
    config.write_text('{"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}}')
    assert fingerprint() != first


@pytest.mark.parametrize(("reward", "parameter"), [
    ({"custom_reward_function": {"path": "gone.py", "name": "score"}},
     "reward.custom_reward_function.path='gone.py'"),
    ({"terms": [{"name": "compute_score"}, {"name": "score", "path": "gone.py"}]},
     "reward.terms[1].path='gone.py'"),
    ({"custom_reward_function": {"path": "pkg://no_such_module_here", "name": "score"}},
     "reward.custom_reward_function.path='pkg://no_such_module_here'"),
    ({"custom_reward_function": {"path": "pkg://no_such_package.rewards", "name": "score"}},
     "reward.custom_reward_function.path='pkg://no_such_package.rewards'"),
])
def test_a_reward_file_that_is_not_there_is_named_by_its_parameter(
        tiny_model_dir, tmp_path, reward, parameter) -> None:
    with pytest.raises(ConfigError) as err:
        _identity(tiny_model_dir, tmp_path, reward)
    assert str(err.value) == (f"{parameter}: no such file (a Python file that defines the "
                              "reward function, or pkg://<module> for an importable module)")


def test_a_reward_module_is_hashed_by_its_file(tiny_model_dir, tmp_path) -> None:
    reward = {"custom_reward_function": {"path": "pkg://rl_pipeline.rewards.scoring",
                                         "name": "compute_score"}}
    import rl_pipeline.rewards.scoring as module
    from rl_pipeline.engines.run_identity import _file_sha256

    assert _identity(tiny_model_dir, tmp_path, reward).inputs["reward"]["file_sha256"] == \
        _file_sha256(Path(module.__file__))


def test_the_cleanup_never_deletes_an_identity_a_run_is_training_in(tmp_path) -> None:
    """A long scheduled train (the oldest identity file) beside three newer runs by hand:
    the last of them to end deleted its checkpoints while it trained. A second run of the
    same identity would have written the same checkpoints beside it."""
    import os
    import subprocess
    import sys
    import time

    import pytest

    from rl_pipeline.engines.run_identity import (
        IDENTITY_FILE,
        CheckpointRoot,
        IdentityBusyError,
        prune,
        training_in,
    )

    root = CheckpointRoot(str(tmp_path), keep_identities=3)
    folders = []
    for i, name in enumerate("abcd"):
        folder = tmp_path / (name * 12)
        folder.mkdir()
        (folder / IDENTITY_FILE).write_text("{}")
        os.utime(folder / IDENTITY_FILE, (1000 + i, 1000 + i))  # a is the oldest
        folders.append(folder)
    # The long run holds its identity in another process, as the scheduled train would.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from rl_pipeline.engines.run_identity import training_in\n"
        f"with training_in(Path({str(folders[0])!r})):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(IdentityBusyError, match="another run is training run identity"):
            with training_in(folders[0]):
                pass
        assert prune(root, folders[3]) == []  # a is in use: kept, the rest are the newest 3
        assert folders[0].is_dir()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert prune(root, folders[3]) == [folders[0]]  # its run ended: now it goes
    assert not folders[0].exists() and not (tmp_path / f".{folders[0].name}.lock").exists()
    with training_in(folders[1]):  # free again: taken
        assert folders[1].is_dir()


def test_a_new_identity_says_what_differs_from_the_one_trained_last(tiny_model_dir,
                                                                     tmp_path) -> None:
    """A rerun with a changed parameter after an interruption trained from step 0, and only
    verl's "Training from scratch" said so: now the stage names the change and the folder
    of the run it did not continue."""
    from rl_pipeline.engines.run_identity import claim, what_changed

    root = tmp_path / "checkpoints"
    earlier = _identity(tiny_model_dir, tmp_path, {})
    claim(root / earlier.short, earlier, "run-1")
    prompts = tmp_path / "train.parquet"
    setup = TrainSetup(str(prompts), str(prompts), str(tiny_model_dir), str(tmp_path),
                       TrainParams.model_validate({"engine": "trl", "trl": {"max_steps": 12}}),
                       DataParams(), RewardParams())
    now = run_identity(setup, "trl")
    assert now.fingerprint != earlier.fingerprint
    said = what_changed(root / now.short, now)
    assert said.startswith(f"run identity {now.short} is new: it trains from step 0. The "
                           f"identity trained last here, {earlier.short} (MLflow run run-1), "
                           "differs in: train.trl.max_steps ")
    assert "-> 12." in said and f"checkpoints in {root / earlier.short}" in said
    assert what_changed(root / earlier.short, earlier) is None  # the only one there
