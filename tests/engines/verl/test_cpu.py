"""verl's own trainer on this CPU (train.verl.device=cpu, rl_pipeline.engines.verl.cpu).

The slow tests run verl's real ``run_ppo`` (driver, TaskRunner, trainer loop, agent loop,
reward loop, GRPO advantage, FSDP2 + LoRA update, weight sync, checkpoints) on a tiny Qwen2
in a process of their own: a run SIGKILLed mid-way resumes through verl's own resume, the
adapter it trained merges, and a rollout that never receives the adapter is caught by the
rollout-policy check from verl's own metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from rl_pipeline.engines.base import BAND_MAX, BAND_MIN, BAND_STD
from rl_pipeline.engines.forecast import FIRST_STEP_METRIC
from rl_pipeline.engines.problems import PreflightError
from rl_pipeline.engines.verl.agreement import agreement_report
from rl_pipeline.engines.verl.checkpoint import complete_steps, export_result
from rl_pipeline.engines.verl.config import CPU_MODULE
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.engines.verl.rollout_check import (
    RolloutPolicyError,
    StepAgreement,
    check_rollout_policy,
)
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from rl_pipeline.training_rollouts import TABLE
from tests.conftest import PROJECT_ROOT
from tests.engines.verl.cpu_job import CPU_VERL
from tests.verl_inputs import SMALL, verl_prompts

# Slow: verl trains on a local Ray.
pytestmark = pytest.mark.slow

# A reward that varies within each group of a random model's answers: longer pays more.
LENGTH_REWARD = ("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    return min(len(solution_str), 200) / 200\n")
# Large enough that one step moves a 100k-parameter model's LoRA measurably.
LEARNING_RATE = 0.1
# The rollout-policy check as conf/cpu sets it: a synced run must pass it, a sabotaged fail.
CPU_THRESHOLDS = {k: v for k, v in yaml.safe_load(
    (PROJECT_ROOT / "conf/cpu/parameters.yml").read_text())["train"]["verl"].items()
    if k in ("rollout_max_probs_diff", "rollout_min_probs_pearson")}


def test_the_verl_internals_the_cpu_mode_leans_on_are_where_it_expects() -> None:
    from rl_pipeline.engines.verl import cpu as verl_cpu
    from rl_pipeline.engines.verl import hf_rollout
    from rl_pipeline.engines.verl.cpu.internals import check_verl_internals

    assert check_verl_internals() == []
    assert CPU_MODULE == verl_cpu.__name__  # the module every Ray process imports
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    assert get_rollout_class("hf", "async") is hf_rollout.HFServerAdapter
    assert get_rollout_replica_class("hf") is hf_rollout.HFReplica


def test_cpu_preflight_refuses_what_the_cpu_mode_cannot_run(inputs) -> None:
    bad = VerlParams(**{**SMALL, "device": "cpu", "ENGINE": "vllm",
                        "algorithm_adv_estimator": "gae", "actor_model_lora_rank": 0,
                        "trainer_n_gpus_per_node": 1,
                        "rollout_tensor_model_parallel_size": 2})
    with pytest.raises(PreflightError) as failure:
        plan_verl(bad, DataParams(), RewardParams(), inputs, gpus_visible=0, training=True,
                  train_rows=16)
    message = str(failure.value)
    for expected in ("train.verl.ENGINE='vllm': hf, or unset, with device: cpu",
                     "train.verl.algorithm_adv_estimator='gae'",
                     "train.verl.actor_model_lora_rank=0: at least 1 with device: cpu",
                     "train.verl.actor_fsdp_config_offload_policy=True: false with device: cpu",
                     "train.verl.rollout_tensor_model_parallel_size=2: at most "
                     "trainer_n_gpus_per_node with device: cpu"):
        assert expected in message, message


def test_a_cpu_plan_describes_its_steps_for_the_forecast(inputs) -> None:
    from rl_pipeline.engines.verl.plan import step_work

    verl = VerlParams(**{**CPU_VERL, "total_training_steps": 6, "trainer_save_freq": 4,
                         "trainer_max_actor_ckpt_to_keep": 1})
    plan = plan_verl(verl, DataParams(data_max_response_length=32), RewardParams(), inputs,
                     gpus_visible=0, training=True, train_rows=16)
    work = step_work(plan.config, plan.report["host"], verl)
    assert (work.engine, work.steps, work.prompts, work.completions, work.response_cap) == \
        ("verl", 6, 4, 4, 32)
    # verl recomputes the old log-probs every step; the spec's KL loss adds a reference pass.
    assert (work.log_prob_passes, work.update_passes, work.recompute) == (2.0, 1.0, True)
    assert (work.device, work.devices, work.tensor_parallel, work.dtype,
            work.rollout_backend) == ("cpu", 1, 1, "float32", "hf")
    assert work.lora == {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
                         "target_modules": "all-linear"}
    # Saved at steps 4 and 6, one kept, of the size the disk check used; the base model's
    # weights sized from its files.
    assert (work.saves, work.checkpoints_kept) == (2, 1)
    assert work.checkpoint_gib == plan.report["host"]["plan"]["checkpoint_gib"]
    assert work.model_gib > 0
    no_kl = VerlParams(**{**CPU_VERL, "actor_use_kl_loss": False})
    plan = plan_verl(no_kl, DataParams(), RewardParams(), inputs, gpus_visible=0,
                     training=True, train_rows=16)
    assert step_work(plan.config, plan.report["host"], no_kl).log_prob_passes == 1.0


def test_a_log_prob_micro_batch_that_does_not_divide_each_gpus_share_is_refused(
        inputs) -> None:
    """verl asserts it only after the first rollout (workers/engine/utils.py): found by the
    first CPU run, where 4 prompts x 4 samples met the spec's micro-batch of 20."""
    verl = VerlParams(**{**CPU_VERL, "rollout_log_prob_micro_batch_size_per_gpu": 20,
                         "ref_log_prob_micro_batch_size_per_gpu": 3})
    with pytest.raises(PreflightError) as failure:
        plan_verl(verl, DataParams(), RewardParams(), inputs, gpus_visible=0, training=True,
                  train_rows=16)
    message = str(failure.value)
    assert ("rollout_log_prob_micro_batch_size_per_gpu=20: a divisor of each GPU's share of "
            "the step's batch, 16") in message
    assert "ref_log_prob_micro_batch_size_per_gpu=3" in message
    # Without a reference (no KL), its micro-batch is not used and not checked.
    plan_verl(VerlParams(**{**CPU_VERL, "ref_log_prob_micro_batch_size_per_gpu": 3,
                            "actor_use_kl_loss": False}),
              DataParams(), RewardParams(), inputs, gpus_visible=0, training=True,
              train_rows=16)


def test_the_rollout_policy_check_reads_both_views_of_verls_metric() -> None:
    same = [StepAgreement(1, 3e-5, 0.9993), StepAgreement(2, 4e-5, 0.985)]
    summary = check_rollout_policy(same, 0.05, 0.9, "ckpt")
    assert summary == {"checked_steps": 2, "max_probs_diff": 4e-5, "max_probs_diff_step": 2,
                       "min_pearson": 0.985}
    # A flat distribution: the mean gap stays small, the correlation falls.
    flat = [StepAgreement(1, 4e-5, 0.9993), StepAgreement(2, 8e-4, 0.37)]
    with pytest.raises(RolloutPolicyError, match=r"at 1 of 2 steps .*step 2: mean gap "
                       r"0.0008, pearson 0.370.*LoRA adapter never reached the rollout"):
        check_rollout_policy(flat, 0.05, 0.9, "ckpt")
    peaked = [StepAgreement(1, 0.2, None)]
    with pytest.raises(RolloutPolicyError, match="rollout_max_probs_diff=0.05"):
        check_rollout_policy(peaked, 0.05, None, "ckpt")
    assert check_rollout_policy(flat, None, None, "ckpt")["checked_steps"] == 2
    assert check_rollout_policy([StepAgreement(1, math.nan)], 0.05, 0.9, "c") == {
        "checked_steps": 0, "max_probs_diff": None}


@pytest.fixture(scope="module")
def cpu_bed(tmp_path_factory, tiny_model_dir) -> dict:
    root = tmp_path_factory.mktemp("verl_cpu")
    (root / "reward.py").write_text(LENGTH_REWARD)
    uri = f"sqlite:///{root}/mlflow.db"
    return {"root": root, "tracking_uri": uri, "model_path": str(tiny_model_dir),
            "train_files": verl_prompts(root / "train.parquet", 16, "train"),
            "val_files": verl_prompts(root / "val.parquet", 6, "test"),
            "reward": {"path": str(root / "reward.py"), "name": "score"}}


def _client(uri: str) -> mlflow.MlflowClient:
    # A client of its own: the fluent API's active experiment would outlive this module.
    return mlflow.MlflowClient(tracking_uri=uri)


def _new_run(uri: str, name: str) -> str:
    client = _client(uri)
    experiment = client.get_experiment_by_name("verl_cpu")
    experiment_id = (experiment.experiment_id if experiment
                     else client.create_experiment("verl_cpu"))
    run = client.create_run(experiment_id, run_name=name)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def _job(bed: dict, name: str, checkpoints: Path,
         first_step_forecast_s: float | None = None, **verl) -> tuple[Path, str]:
    run_id = _new_run(bed["tracking_uri"], name)
    job = bed["root"] / f"{name}.json"
    job.write_text(json.dumps({
        **{k: bed[k] for k in ("tracking_uri", "model_path", "train_files", "val_files",
                               "reward")},
        "checkpoints": str(checkpoints), "run_id": run_id,
        "first_step_forecast_s": first_step_forecast_s,
        "verl": {"actor_optim_lr": LEARNING_RATE, **CPU_THRESHOLDS, **verl}}))
    return job, run_id


def _start(job: Path) -> subprocess.Popen:
    log = open(f"{job}.log", "w")  # noqa: SIM115 (the process writes it)
    # A session of its own: the kill takes verl's Ray (raylet, GCS, actors) with it.
    return subprocess.Popen([sys.executable, "-m", "tests.engines.verl.cpu_job", str(job)],
                            cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _history(uri: str, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in _client(uri).get_metric_history(run_id, key)}


def _newest(checkpoints: Path) -> int:
    marker = checkpoints / "latest_checkpointed_iteration.txt"
    return int(marker.read_text().strip()) if marker.exists() else 0


# What the one-rank run and the two-rank run set alike. No LoRA dropout: each rank draws its
# own masks, for its own half of the batch (the sabotaged run below trains with conf/cpu's
# dropout, from the initial adapter that carries it). A step's requests batched whole however
# busy the machine (a batch split otherwise draws other random numbers: CI's other worker
# once made one run's rollout do so).
SAME_DRAWS = {"actor_model_lora_dropout": 0.0,
              "overrides": ["+actor_rollout_ref.rollout.custom.hf_rollout.batch_window_s=1.0"]}
# The one-rank run: killed once its step 2 reached MLflow (so that the two-rank run has two
# uninterrupted steps to be compared with), resumed to the last step. A verl start costs
# about a minute on one core and a step of the tiny model 2-3 s: one run serves both tests.
KILLED_AFTER, STEPS = 2, 5
# One epoch set, 4 steps of its 16 prompts: total_training_steps must override it (verl
# stops at the first of the two; plan.epochs_for gives it 2).
ONE_EPOCH = {"trainer_total_epochs": 1}


@pytest.fixture(scope="module")
def one_rank(cpu_bed) -> dict:
    """A one-rank run SIGKILLed (verl's driver, its Ray, every actor) after step 2, its
    record of the newest step emptied, then resumed to its last step with a forecast its
    first step overruns."""
    uri = cpu_bed["tracking_uri"]
    checkpoints = cpu_bed["root"] / "ranks1"
    first, first_run = _job(cpu_bed, "killed", checkpoints, total_training_steps=STEPS,
                            **SAME_DRAWS, **ONE_EPOCH)
    process = _start(first)
    client = _client(uri)
    deadline = time.monotonic() + 600
    while (process.poll() is None and time.monotonic() < deadline
           and KILLED_AFTER not in {m.step for m in client.get_metric_history(
               first_run, "actor/pg_loss")}):
        time.sleep(0.3)
    assert process.poll() is None, Path(f"{first}.log").read_text()[-3000:]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    # The newest step saved whole (the kill may fall between a step's last file and verl's
    # record of it, which then names the step before)
    recorded, killed_at = _newest(checkpoints), complete_steps(checkpoints)[-1]
    assert KILLED_AFTER <= recorded <= killed_at <= recorded + 1 and killed_at < STEPS
    # As a power loss can leave it: verl writes this record in place (its resume raised
    # ValueError on an empty one; the engine rewrites it from the newest complete step).
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("")

    # A forecast the first step will overrun: the warning, as a user on a busy machine sees it.
    second, second_run = _job(cpu_bed, "resumed", checkpoints, total_training_steps=STEPS,
                              first_step_forecast_s=0.01, **ONE_EPOCH,
                              **{**SAME_DRAWS, "overrides": [
                                  *SAME_DRAWS["overrides"],
                                  f"+actor_rollout_ref.rollout.custom.hf_rollout."
                                  f"agreement_dir={cpu_bed['root'] / 'agreement'}"]})
    rerun = _start(second)
    assert rerun.wait(timeout=600) == 0, Path(f"{second}.log").read_text()[-3000:]
    return {"checkpoints": checkpoints, "killed_at": killed_at, "first_run": first_run,
            "second_run": second_run, "log": Path(f"{second}.log").read_text(),
            **json.loads(Path(f"{second}.out.json").read_text())}  # summary, history


@pytest.mark.slow
def test_verl_trains_on_a_cpu_survives_a_kill_and_its_adapter_merges(cpu_bed, one_rank,
                                                                     tmp_path) -> None:
    from rl_pipeline.merge.standalone import make_standalone_model
    from rl_pipeline.params import MergeParams

    checkpoints, killed_at = one_rank["checkpoints"], one_rank["killed_at"]
    first_run, second_run, steps = one_rank["first_run"], one_rank["second_run"], STEPS
    summary = one_rank["summary"]
    assert summary["resumed_from_step"] == killed_at and summary["steps"] == steps
    # This run's first step against the forecast: logged once (from verl's trainer, in its
    # Ray actor) and an MLflow metric at that step.
    took = _history(cpu_bed["tracking_uri"], second_run, FIRST_STEP_METRIC)
    assert list(took) == [killed_at + 1] and took[killed_at + 1] > 0.02
    log = one_rank["log"]
    assert re.search(rf"step {killed_at + 1} took [\d.]+ s, forecast 0\.0 s: [\d.]+x the "
                     "forecast", log), log[-3000:]
    assert len(re.findall(r"step \d+ took", log)) == 1
    # Nothing of verl's libraries repeated at every step: TransferQueue's warning that its
    # 8 threads exceed the cores, MLflow's download bar as the rollout table is appended.
    assert "target_num_threads" not in log and "Downloading artifacts" not in log, log[-3000:]
    # verl's own metrics: the killed attempt logged the steps it finished, the rerun the
    # rest, each once: nothing redone, nothing skipped.
    first_steps = set(_history(cpu_bed["tracking_uri"], first_run, "critic/score/mean"))
    assert first_steps <= set(range(1, killed_at + 2))
    rerun_metrics = {key: _history(cpu_bed["tracking_uri"], second_run, key) for key in (
        "critic/score/mean", "actor/pg_loss", "actor/grad_norm", "timing_s/step",
        "training/rollout_probs_diff_mean")}
    for key, history in rerun_metrics.items():
        assert set(history) == set(range(killed_at + 1, steps + 1)), (key, history)
        assert all(math.isfinite(v) for v in history.values()), (key, history)
    # The rollout sampled the trained policy: the actor computes in the rollout's float32,
    # so their token probabilities agree to rounding (verl's bfloat16 default did not).
    policy = summary["rollout_policy"]
    assert policy["checked_steps"] == steps - killed_at
    assert policy["min_pearson"] >= 0.9999 and policy["max_probs_diff"] <= 1e-4, policy
    # What the model wrote at each step: the table and the degeneration rates, per step.
    client = _client(cpu_bed["tracking_uri"])
    table = json.loads(Path(client.download_artifacts(second_run, TABLE, str(tmp_path)))
                       .read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    per_step = Counter(r["step"] for r in rows)  # train.rollouts_logged_per_step of each
    assert per_step == {s: 4 for s in range(killed_at + 1, steps + 1)}
    # A prompt's group together (rollout_n is 4), as TRL's table has them.
    assert all(len({r["prompt"] for r in rows if r["step"] == s}) == 1 for s in per_step)
    assert "score" not in table["columns"]  # the reward is the "reward" column
    assert {"prompt", "response", "reward", "reward_function", "reward_error",
            "reward_timeout", "truncated", "repetitive"} <= set(table["columns"])
    for key in ("rollouts/truncation_rate", "rollouts/repetition_rate",
                "rollouts/reward_error/mean", "rollouts/reward_timeout/mean"):
        assert set(_history(cpu_bed["tracking_uri"], second_run, key)) == \
            set(range(killed_at + 1, steps + 1)), key
    # The reward curve's history: verl's mean score per step, within our trainer's band.
    history = one_rank["history"]
    assert [h["step"] for h in history] == list(range(killed_at + 1, steps + 1))
    for h in history:
        assert h[BAND_MIN] - 1e-6 <= h["reward"] <= h[BAND_MAX] + 1e-6, h  # float32 mean
        assert h[BAND_STD] >= 0, h
    assert set(_history(cpu_bed["tracking_uri"], second_run,
                        "rollouts/reward_error/mean").values()) == {0.0}
    # The same tokens scored again: the rollout is the float32 policy of the adapter it held.
    report = agreement_report(cpu_bed["root"] / "agreement", cpu_bed["model_path"], 1.0)
    assert [r["step"] for r in report] == list(range(killed_at + 1, steps + 1))
    for row in report:
        same = row["float32, the rollout's adapter"]
        assert same["rollout"].pearson > 0.9999 and same["actor"].pearson > 0.9999, row

    # verl's checkpoint -> the adapter (verl's model merger) -> a merged, verified model.
    adapter = export_result(checkpoints, tmp_path / "scratch", summary)
    from safetensors.torch import load_file

    tensors = load_file(adapter / "adapter_model.safetensors")
    lora_b = [t for name, t in tensors.items() if "lora_B" in name]
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)  # B starts at zero: trained
    merged = make_standalone_model(str(adapter), cpu_bed["model_path"], MergeParams(),
                                   tmp_path / "scratch")
    assert merged.metadata["verification"]["passed"]
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(cpu_bed["model_path"]).state_dict()
    after = AutoModelForCausalLM.from_pretrained(merged.path).state_dict()
    assert any(not torch.allclose(base[k].float(), after[k].float()) for k in base
               if "proj" in k)


@pytest.mark.slow
def test_a_rollout_without_the_trained_adapter_is_caught(cpu_bed) -> None:
    """The sabotage verl's vLLM server commits when the adapter is not listed: generation
    with the base model. verl's metrics show it one step later; the run fails, naming it."""
    job, _ = _job(cpu_bed, "sabotaged", cpu_bed["root"] / "sabotaged", total_training_steps=2,
                  overrides=["+actor_rollout_ref.rollout.custom.hf_rollout.sync_adapter="
                             "false"])
    process = _start(job)
    assert process.wait(timeout=600) != 0
    result = json.loads(Path(f"{job}.out.json").read_text())
    assert result["error"] == "RolloutPolicyError", result
    assert "step 2" in result["message"] and "pearson" in result["message"]
    assert "LoRA adapter never reached the rollout" in result["message"]


@pytest.mark.slow
def test_sigterm_mid_training_ends_the_run_as_a_stop_not_an_abort(cpu_bed) -> None:
    """A scheduler's stop (SIGTERM) while verl trains: the run ends through the CLI's
    handler (Terminated, exit 143: kedro's hooks mark the MLflow run FAILED). verl's
    ray.init had replaced it with Ray's, and Ray's core aborted the process (SIGABRT, the
    run left RUNNING); Ray's handler also stayed for the stages after train."""
    job, run_id = _job(cpu_bed, "stopped", cpu_bed["root"] / "stopped",
                       total_training_steps=4)
    data = json.loads(job.read_text())
    job.write_text(json.dumps({**data, "stops_raise": True}))
    process = _start(job)
    client = _client(cpu_bed["tracking_uri"])
    deadline = time.monotonic() + 600
    while (process.poll() is None and time.monotonic() < deadline
           and not client.get_metric_history(run_id, "actor/pg_loss")):
        time.sleep(0.3)
    assert process.poll() is None, Path(f"{job}.log").read_text()[-3000:]
    os.kill(process.pid, signal.SIGTERM)  # the driver alone: Ray's processes are its children
    assert process.wait(timeout=300) == 128 + signal.SIGTERM, \
        Path(f"{job}.log").read_text()[-3000:]
    result = json.loads(Path(f"{job}.out.json").read_text())
    assert result["terminated"] == "stopped by SIGTERM", result
    # The CLI's SIGHUP handler is back (Ray's would have stayed); SIGTERM's was set to the
    # default by the CLI's handler as it raised, so that a second SIGTERM ends it at once.
    assert result["handlers"] == {"SIGTERM": "SIG_DFL", "SIGHUP": "_raise_terminated"}


@pytest.mark.slow
def test_two_runs_of_one_seed_with_lora_dropout_train_alike(cpu_bed) -> None:
    """verl hands the trainer a step's samples as they finished, another order each run, and
    the actor's dropout masks fell on other samples: two runs parted at their first update.
    In the order of their tokens (trainer.in_content_order) the runs are the same to the bit."""
    settings = {**SAME_DRAWS, "actor_model_lora_dropout": 0.05}
    runs = []
    for name in ("repeat1", "repeat2"):
        job, run_id = _job(cpu_bed, name, cpu_bed["root"] / name, total_training_steps=2,
                           **settings)
        assert _start(job).wait(timeout=600) == 0, Path(f"{job}.log").read_text()[-3000:]
        runs.append({key: _history(cpu_bed["tracking_uri"], run_id, key)
                     for key in SAME_SAMPLES + SAME_MATHEMATICS})
    first, second = runs
    assert set(first["actor/grad_norm"]) == {1, 2}
    assert all(v > 0 for v in first["actor/grad_norm"].values())  # both steps updated
    assert first == second


# Two gloo ranks (FSDP2 shards the actor over them) against one: one rollout server for
# both (a replica spans them), so that both runs sample the same responses.
TWO_RANKS = {"trainer_n_gpus_per_node": 2, "rollout_tensor_model_parallel_size": 2}
# What two ranks change is the order of float32 sums: FSDP2 all-reduces the two halves'
# gradients, and verl averages the ranks' loss metrics, where one rank sums in one pass.
# Measured here: the same responses and scores at both steps, grad norm and entropy equal
# to the last bit, the policy loss 3e-7 apart (relative) at step 1 and 1.4e-5 at step 2,
# after one update's rounding. 1e-4 leaves room for that, and none for an error of
# mathematics (a loss scaled by the rank count is off by 2x; one rank's half alone, by far
# more than this).
RANKS_RTOL = 1e-4
SAME_SAMPLES = ("critic/score/mean", "response_length/mean")
SAME_MATHEMATICS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy")


@pytest.mark.slow
def test_two_ranks_train_as_one_does_and_their_sharded_checkpoint_merges(cpu_bed, one_rank,
                                                                       tmp_path) -> None:
    from rl_pipeline.merge.standalone import make_standalone_model
    from rl_pipeline.params import MergeParams

    # The one-rank run's first steps, before its kill (the resumed run draws other samples:
    # the rollout's generator starts again from the seed).
    steps = KILLED_AFTER
    one = {key: {s: v for s, v in _history(cpu_bed["tracking_uri"], one_rank["first_run"],
                                           key).items() if s <= steps}
           for key in SAME_SAMPLES + SAME_MATHEMATICS}
    job, run_id = _job(cpu_bed, "ranks2", cpu_bed["root"] / "ranks2",
                       total_training_steps=steps, **SAME_DRAWS, **TWO_RANKS)
    assert _start(job).wait(timeout=600) == 0, Path(f"{job}.log").read_text()[-3000:]
    two = {key: _history(cpu_bed["tracking_uri"], run_id, key)
           for key in SAME_SAMPLES + SAME_MATHEMATICS}
    assert set(one["actor/grad_norm"]) == set(range(1, steps + 1))
    assert any(v > 0 for v in one["actor/grad_norm"].values())  # a step that learned
    for key in SAME_SAMPLES:  # the rollout drew the same responses, which scored the same
        for step, value in one[key].items():  # (a mean: summed in another order)
            assert two[key][step] == pytest.approx(value, rel=1e-6), (key, one[key], two[key])
    for key in SAME_MATHEMATICS:
        for step, value in one[key].items():
            assert two[key][step] == pytest.approx(value, rel=RANKS_RTOL, abs=1e-6), \
                (key, step, one[key], two[key])
    # Each rank wrote its shard; verl's merger joins them into the adapter, which merges.
    actor = cpu_bed["root"] / "ranks2" / f"global_step_{steps}" / "actor"
    assert {p.name for p in actor.glob("model_world_size_*")} == {
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"}
    summary = {"steps": steps}
    adapter = export_result(cpu_bed["root"] / "ranks2", tmp_path / "scratch", summary)
    merged = make_standalone_model(str(adapter), cpu_bed["model_path"], MergeParams(),
                                   tmp_path / "scratch")
    assert merged.metadata["verification"]["passed"]
