"""The forecast of a run's time and cost: the calibration on this machine with a real model,
the arithmetic that scales it (and the GPU estimate's), and the first step's verdict."""

from __future__ import annotations

import logging
from dataclasses import replace

import pandas as pd
import pytest

from rl_pipeline.engines.calibration import Calibration, calibrate, conversations
from rl_pipeline.engines.forecast import (
    CPU_COSTS,
    CPU_EVAL_MODEL_S,
    FIRST_STEP_METRIC,
    GPU_ASSUMPTIONS,
    first_step_message,
    forecast_cpu,
    forecast_gpu,
    forecast_lines,
    forecast_metrics,
    gpu_kind,
    mean_prompt_tokens,
)
from rl_pipeline.engines.work import EvalWork, StepWork
from rl_pipeline.evaluation.generate import SamplingSettings
from rl_pipeline.models.facts import ModelFacts
from tests.verl_inputs import verl_prompts

WORK = StepWork(engine="trl", steps=40, prompts=2, completions=4, response_cap=48,
                rollouts_per_step=1.0, log_prob_passes=0.0, update_passes=1.0,
                recompute=False, temperature=0.6, top_p=1.0, top_k=-1, seed=42,
                dtype="float32", lora={"r": 8, "lora_alpha": 16, "target_modules": "all-linear"},
                device="cpu", devices=1, tensor_parallel=1, saves=4, checkpoint_gib=0.05,
                checkpoints_kept=2, model_gib=0.5)
EVAL = EvalWork(prompts=200, sampling=SamplingSettings(max_new_tokens=48, greedy=True),
                batch_size=32, dtype="auto")
# What a calibration of SmolLM2 on 2 cores measures (rounded): 8 sequences.
MEASURED = Calibration(sequences=8, rollout_s=4.0, response_tokens=16.0, forward_s=2.5,
                       update_s=6.0, load_s=1.5, eval_batch_s=8.0, eval_batch_sequences=32,
                       peak_rss_gib=2.0, seconds=22.0)
# A 7B model's size, as ModelFacts reads it from the safetensors headers (Qwen2.5-7B's
# shapes, LoRA rank 64 on every linear layer).
SEVEN_B = ModelFacts(parameters=7_615_616_512, bytes_on_disk=15_231_233_024,
                     vocab_size=152_064, hidden_size=3584, layers=28,
                     lora_parameters=161_480_704)


def test_the_cpu_forecast_is_the_calibrated_step_times_the_steps_plus_the_engines_costs():
    forecast = forecast_cpu(WORK, MEASURED, EVAL, price_per_device_hour=2.0)
    trl = CPU_COSTS["trl"]
    step = 4.0 + 6.0 + trl.step_s
    assert forecast["step_s"] == {"rollout": 4.0, "log_probs": 0.0, "update": 6.0,
                                  "other": trl.step_s, "total": pytest.approx(step)}
    assert forecast["train_s"] == pytest.approx(
        trl.start_s + trl.first_step_s + 40 * step + 4 * trl.save_s, abs=0.1)
    assert forecast["first_step_s"] == pytest.approx(step + trl.first_step_s)
    # Eval: the base and the trained model, 200 prompts in batches of 32 at 8 s a batch.
    assert forecast["eval_s"] == pytest.approx(2 * (CPU_EVAL_MODEL_S + 8.0 * 200 / 32), abs=0.1)
    assert forecast["disk_gib"] == pytest.approx(2 * 0.05 + 2 * 0.5)
    hours = (forecast["train_s"] + forecast["eval_s"]) / 3600
    assert forecast["device_hours"] == pytest.approx(hours, abs=1e-3)
    assert forecast["cost"] == pytest.approx(2.0 * hours, abs=0.01)
    assert forecast["basis"] == "calibrated on this machine"
    assert forecast_cpu(WORK, MEASURED, EVAL, None)["cost"] is None


def test_each_engines_work_changes_the_forecast_as_it_changes_the_step():
    base = forecast_cpu(WORK, MEASURED, EVAL, None)["step_s"]
    # A batch twice the calibration's: every pass twice as long.
    doubled = forecast_cpu(replace(WORK, prompts=4), MEASURED, EVAL, None)["step_s"]
    assert doubled["rollout"] == pytest.approx(2 * base["rollout"])
    assert doubled["update"] == pytest.approx(2 * base["update"])
    # TRL's num_iterations 3: one rollout and one old log-prob pass per three steps.
    reused = forecast_cpu(replace(WORK, rollouts_per_step=1 / 3, log_prob_passes=1 / 3),
                          MEASURED, EVAL, None)["step_s"]
    assert reused["rollout"] == pytest.approx(base["rollout"] / 3, abs=0.01)
    assert reused["log_probs"] == pytest.approx(2.5 / 3, abs=0.01)
    # verl: old log-probs and a reference pass, gradient checkpointing's second forward,
    # and its own start-up (Ray, the workers, the rollout server) and processes.
    verl = forecast_cpu(replace(WORK, engine="verl", log_prob_passes=2.0, recompute=True),
                        MEASURED, EVAL, None)
    assert verl["step_s"]["log_probs"] == pytest.approx(5.0)
    assert verl["step_s"]["update"] == pytest.approx(6.0 + 2.5)
    assert verl["start_s"] == CPU_COSTS["verl"].start_s > CPU_COSTS["trl"].start_s
    assert verl["peak_memory_gib"] > forecast_cpu(WORK, MEASURED, EVAL, None)["peak_memory_gib"]


def test_the_gpu_estimate_follows_the_gpu_the_ranks_and_what_is_trained():
    work = replace(WORK, engine="verl", device="cuda", devices=8, tensor_parallel=2,
                   prompts=512, completions=5, response_cap=1024, log_prob_passes=2.0,
                   recompute=True, gpu_peak_gib=60.0, rollout_backend="vllm")
    h100 = forecast_gpu(work, SEVEN_B, EVAL, 200.0, 3.0, gpu_name="NVIDIA H100 80GB HBM3")
    l4 = forecast_gpu(work, SEVEN_B, EVAL, 200.0, 3.0, gpu_name="NVIDIA L4")
    assert "H100" in h100["basis"] and "estimate" in h100["basis"]
    assert l4["step_s"]["total"] > h100["step_s"]["total"]
    assert h100["assumptions"] == GPU_ASSUMPTIONS and h100["peak_memory_gib"] == 60.0
    # Twice the GPUs: the passes take half as long (the rollout has twice the replicas).
    wide = forecast_gpu(replace(work, devices=16), SEVEN_B, EVAL, 200.0, 3.0,
                        gpu_name="NVIDIA H100 80GB HBM3")
    assert wide["step_s"]["update"] == pytest.approx(h100["step_s"]["update"] / 2, rel=0.01)
    assert wide["step_s"]["rollout"] < h100["step_s"]["rollout"]
    # Every weight trained (no LoRA): 6 FLOPs per parameter and token, not 4 (+2 recompute).
    full = forecast_gpu(replace(work, lora=None), SEVEN_B, EVAL, 200.0, 3.0,
                        gpu_name="NVIDIA H100 80GB HBM3")
    assert full["step_s"]["update"] == pytest.approx(h100["step_s"]["update"] * 8 / 6,
                                                     rel=0.01)
    # Cost: every GPU for the training, one for eval.
    assert h100["cost"] == pytest.approx(
        3.0 * (8 * h100["train_s"] + h100["eval_s"]) / 3600, abs=0.01)
    # No GPU to name: an H100 assumed, and said.
    assert gpu_kind(None)[0].name == "H100" and not gpu_kind(None)[1]
    unnamed = forecast_gpu(work, SEVEN_B, EVAL, 200.0, None, gpu_name="")
    assert "no GPU named here: assumed H100" in unnamed["basis"]
    assert "estimate" in forecast_lines(unnamed) and "per GPU" in forecast_lines(unnamed)


def test_the_gpu_estimate_charges_each_engine_and_generator_its_own_start_and_decoding():
    # SmolLM2-135M's size: a model this small decodes faster than transformers' generate can
    # take a step, so the per-step floor decides its rollout and HF eval.
    small = ModelFacts(parameters=134_515_008, bytes_on_disk=269_060_552, vocab_size=49_152,
                       hidden_size=576, layers=30, lora_parameters=2_442_240)
    trl = replace(WORK, device="cuda")  # transformers' generate (TRL without use_vllm)
    verl = replace(trl, engine="verl", log_prob_passes=2.0, rollout_backend="vllm")
    h100 = "NVIDIA H100 80GB HBM3"
    a = GPU_ASSUMPTIONS
    t = forecast_gpu(trl, small, EVAL, 100.0, None, gpu_name=h100)
    v = forecast_gpu(verl, small, replace(EVAL, backend="vllm"), 100.0, None, gpu_name=h100)
    # One process loading a model against Ray's workers and vLLM's servers.
    assert t["start_s"] == a["trl_start_s"] < v["start_s"] == a["verl_start_s"]
    assert t["train_s"] == pytest.approx(a["trl_start_s"] + 40 * t["step_s"]["total"],
                                         abs=0.2)
    assert t["step_s"]["other"] == a["trl_step_overhead_s"] < v["step_s"]["other"]
    # 24 response tokens (half the cap of 48), each at least one step of generate.
    floor = 24 * a["hf_decode_step_s"]
    assert floor <= t["step_s"]["rollout"] < floor * 1.05
    assert v["step_s"]["rollout"] < floor / 10
    # eval: 200 prompts in 7 batches of at most 32 with transformers, each batch 24 steps
    # (half of max_new_tokens 48), after the model's load; vLLM's start-up instead.
    hf_eval = 2 * (a["hf_eval_model_s"] + 7 * floor)
    assert hf_eval <= t["eval_s"] < hf_eval * 1.05
    assert 2 * a["vllm_eval_model_s"] <= v["eval_s"] < 2 * a["vllm_eval_model_s"] + 5


def test_the_first_step_is_judged_against_the_forecast():
    assert first_step_message(1, 12.0, 10.0) == (logging.INFO,
                                                 "step 1 took 12.0 s, forecast 10.0 s")
    level, message = first_step_message(3, 25.0, 10.0)
    assert level == logging.WARNING
    assert message.startswith("step 3 took 25.0 s, forecast 10.0 s: 2.5x the forecast")
    assert FIRST_STEP_METRIC == "train.actual/first_step_s"


def test_a_resumed_run_is_compared_on_the_steps_it_trained():
    forecast = forecast_cpu(WORK, MEASURED, EVAL, None)
    whole = forecast_metrics(forecast, actual_train_s=forecast["train_s"] * 1.2,
                             steps_trained=40)
    assert whole["forecast/train_s"] == pytest.approx(forecast["train_s"])
    assert whole["forecast/train_ratio"] == pytest.approx(1.2, abs=1e-3)
    half = forecast_metrics(forecast, actual_train_s=100.0, steps_trained=20)
    assert half["forecast/train_s"] == pytest.approx(
        forecast["train_s"] - 20 * forecast["step_s"]["total"], abs=0.01)
    assert half["actual/train_s"] == 100.0


def test_a_trl_run_describes_its_steps_for_the_forecast(tiny_model_dir):
    from rl_pipeline.engines.trl.preflight import step_work
    from rl_pipeline.params.trl import TrlParams

    # The spec's num_iterations 3: one rollout (1 prompt x 8) serves three steps, with one
    # pass for its old log-probs; no reference pass (beta 0).
    spec = step_work(TrlParams(max_steps=30, num_generations=8, save_steps=10,
                               save_total_limit=2), 600, str(tiny_model_dir))
    assert (spec.engine, spec.steps, spec.prompts, spec.completions) == ("trl", 30, 1, 8)
    assert spec.rollouts_per_step == pytest.approx(1 / 3)
    assert spec.log_prob_passes == pytest.approx(1 / 3)
    assert (spec.saves, spec.checkpoints_kept, spec.device, spec.devices) == (3, 2, "cpu", 1)
    # 2 prompts x 4 on-policy, a KL term (a reference pass), epochs counted.
    cpu = step_work(TrlParams(num_iterations=1, num_generations=4, beta=0.04,
                              num_train_epochs=2), 600, str(tiny_model_dir))
    assert (cpu.prompts, cpu.steps, cpu.rollouts_per_step, cpu.log_prob_passes) == \
        (2, 600, 1.0, 1.0)
    assert cpu.lora["r"] == 16 and cpu.checkpoint_gib > 0
    full = step_work(TrlParams(apply_lora=False, max_steps=1), 600, str(tiny_model_dir))
    assert full.lora is None and full.checkpoint_gib > cpu.checkpoint_gib
    # vLLM is forced off on a CPU (trl/config.py): transformers' generate samples.
    assert step_work(TrlParams(use_vllm=True, max_steps=1), 600,
                     str(tiny_model_dir)).rollout_backend == "hf"


def test_the_calibration_reads_the_first_prompts_of_the_file(tmp_path):
    path = verl_prompts(tmp_path / "train.parquet", 5, "train")
    whole = pd.read_parquet(path)["prompt"]
    first = conversations(path, 3)
    assert [[m["content"] for m in c] for c in first] == \
        [[m["content"] for m in prompt] for prompt in whole.head(3)]
    assert first[0][-1]["role"] == "user"
    assert len(conversations(path, 50)) == 5  # a file shorter than asked: all of it


def test_the_gpu_forecast_counts_each_prompts_tokens(tmp_path, tiny_model_dir):
    """transformers 5's BatchEncoding is no dict: the mean was the length of its key names
    ("input_ids", "attention_mask": 11.5 tokens) for any prompts."""
    from rl_pipeline.models.tokenizer import load_tokenizer

    path = verl_prompts(tmp_path / "train.parquet", 5, "train")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    each = [len(tokenizer(tokenizer.apply_chat_template(c, add_generation_prompt=True,
                                                        tokenize=False),
                          add_special_tokens=False)["input_ids"])
            for c in conversations(path, 5)]
    assert mean_prompt_tokens(str(tiny_model_dir), path, {}) == sum(each) / 5 > 20


@pytest.mark.slow
def test_the_calibration_measures_the_configured_step_on_a_real_model(tiny_model_dir,
                                                                      tmp_path):
    train = verl_prompts(tmp_path / "train.parquet", 8, "train")
    val = verl_prompts(tmp_path / "val.parquet", 6, "test")
    work = replace(WORK, prompts=3, completions=2, response_cap=12,
                   lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    sampling = SamplingSettings(max_new_tokens=12, n_samples=2, temperature=1.0, top_p=1.0)
    measured = calibrate(str(tiny_model_dir), train, val, work,
                         replace(EVAL, prompts=6, batch_size=4, sampling=sampling), {})
    assert measured.sequences == 6  # 3 prompts x 2 completions
    assert 0 < measured.response_tokens <= 12
    assert measured.eval_batch_sequences == 8  # eval's first batch: 4 prompts x 2 samples
    # Each part is a share of the whole (no comparison of the parts' times with each other:
    # on a busy machine a backward pass can take less than another moment's forward).
    parts = (measured.load_s, measured.rollout_s, measured.forward_s, measured.update_s,
             measured.eval_batch_s)
    assert all(seconds > 0 for seconds in parts)
    assert sum(parts) <= measured.seconds
    assert measured.peak_rss_gib > 0.1


@pytest.mark.slow
def test_a_bare_forecast_resolves_evals_sampling_from_the_runs_groups(tiny_model_dir,
                                                                      tmp_path):
    """Called outside Kedro (no hook resolved eval's followers), the calibration's eval batch
    sampled at top_k None: TypeError in transformers' top-k processor."""
    from rl_pipeline.engines.base import TrainSetup
    from rl_pipeline.engines.forecast import forecast_run
    from rl_pipeline.params import DataParams, EvalParams, RewardParams, TrainParams

    setup = TrainSetup(verl_prompts(tmp_path / "train.parquet", 8, "train"),
                       verl_prompts(tmp_path / "val.parquet", 6, "test"), str(tiny_model_dir),
                       str(tmp_path / "ckpt"), TrainParams(engine="trl"),
                       DataParams(data_max_response_length=12), RewardParams())
    work = replace(WORK, prompts=3, completions=2, response_cap=12,
                   lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    eval_params = EvalParams(max_prompts=4, batch_size=4, n_samples=2)
    assert eval_params.rollout_val_top_k is None  # a follower, unresolved
    forecast = forecast_run(setup, work, eval_params)
    assert forecast["step_s"]["total"] > 0 and forecast["eval_s"] > 0
