"""How long a run will take and what it will cost, said before it starts (preflight).

On a CPU the forecast scales a calibration on this machine
(:mod:`rl_pipeline.engines.calibration`: the first step's rollout, one log-probability pass and
one update of the configured model, one eval batch) by the run's work
(:class:`rl_pipeline.engines.work.StepWork`), plus what each engine adds around that work
(:data:`CPU_COSTS`, measured here: docs/benchmarks.md, "Forecast against actual").

On GPUs it is arithmetic: the model's size (:class:`rl_pipeline.models.facts.ModelFacts`)
against a GPU kind's throughput (:data:`GPU_KINDS`) at assumed efficiencies
(:data:`GPU_ASSUMPTIONS`). No GPU run has calibrated these yet, so a GPU forecast says it is
an estimate, and names its assumptions.

The train run compares: after its first step it logs "step N took X s, forecast Y s"
(warning above :data:`STEP_WARN_RATIO`), and at its end the forecast and the actual values are
MLflow metrics beside their ratio (:func:`forecast_metrics`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rl_pipeline.engines.calibration import Calibration, calibrate
from rl_pipeline.engines.nvidia import nvidia_smi_query
from rl_pipeline.engines.work import EvalWork, StepWork
from rl_pipeline.models.facts import CUDA_CONTEXT_GIB, MERGE_COPIES, GiB, ModelFacts

if TYPE_CHECKING:
    from rl_pipeline.engines.base import TrainSetup
    from rl_pipeline.params import EvalParams

STEP_WARN_RATIO = 2.0
# The train run's metric of its first step's time (both engines log it at that step), named
# as the train node's forecast metrics are (the catalog's train_metrics prefix "train").
FIRST_STEP_METRIC = "train.actual/first_step_s"


@dataclass(frozen=True)
class EngineCosts:
    """What an engine adds on a CPU to the work the calibration measures."""

    start_s: float       # the train node's start to its first step: loading, building
    step_s: float        # each step beyond generation and the passes: the optimizer step,
    #                      reward, logging (verl: weight sync, TransferQueue and Ray calls)
    first_step_s: float  # the first step's warm-up beyond a later step's time
    save_s: float        # each checkpoint
    memory_gib: float    # the run's processes beyond those holding the model
    rollout_servers: bool  # the rollout has processes of its own (verl: one per replica)


# Fitted on this 2-core machine to 4-step runs of conf/cpu with each engine (2026-11-26,
# benchmarks/bench_forecast.py --steps 4): what the calibration does not cover. verl: Ray,
# TransferQueue, the workers and the rollout server start in 44 s, its first step is 12.5 s
# longer than the next (the rollout server's and the optimizer's warm-up), and a step
# spends 2 s in weight sync, reward, metrics and Ray calls; its actor, rollout server and
# Ray's own processes hold 4 GiB beyond the model processes. An engine without its own
# entry is costed as TRL. docs/benchmarks.md, "Forecast against actual", checks them on
# 40-step runs.
CPU_COSTS: dict[str, EngineCosts] = {
    "trl": EngineCosts(start_s=1.5, step_s=2.8, first_step_s=0.0, save_s=0.5,
                       memory_gib=0.75, rollout_servers=False),
    "verl": EngineCosts(start_s=44.0, step_s=2.0, first_step_s=12.5, save_s=1.0,
                        memory_gib=4.0, rollout_servers=True),
}
# Eval per model beyond generating: loading it, scoring, its tables and plots.
CPU_EVAL_MODEL_S = 12.0


@dataclass(frozen=True)
class GpuKind:
    """A GPU's peak dense bfloat16 throughput and memory bandwidth (its maker's figures)."""

    name: str
    tflops: float
    bandwidth_tb_s: float
    memory_gib: float


# Matched in order against nvidia-smi's name.
GPU_KINDS = (
    GpuKind("H200", 989.0, 4.8, 141.0),
    GpuKind("H100", 989.0, 3.35, 80.0),
    GpuKind("A100-SXM4-80GB", 312.0, 2.04, 80.0),
    GpuKind("A100", 312.0, 1.56, 40.0),
    GpuKind("L40S", 362.0, 0.86, 48.0),
    GpuKind("L4", 121.0, 0.30, 24.0),
)
DEFAULT_GPU = "H100"
# Assumed efficiencies, until a GPU run calibrates them (each is written into the forecast).
# Start-up and eval's per-model cost depend on what runs: verl's Ray workers and vLLM
# servers, or one process that loads the model (TRL; transformers' generate). The lent H100
# (docs/gpu.md) ran the trl engine's train stage of a tiny Qwen2 in 58 s and its HF eval of two
# models in 94 s, each with about 30 s of Kedro's own start: the trl and hf figures below
# leave room for a real model's load. verl's with vLLM have not run on a GPU yet.
GPU_ASSUMPTIONS: dict[str, float] = {
    "train_mfu": 0.35,          # of peak FLOPs in log-prob and update passes
    "prefill_mfu": 0.5,         # of peak FLOPs in the rollout's prefill
    "decode_bandwidth": 0.6,    # of peak bandwidth while decoding (weights read per token)
    # transformers' generate: a decoding step costs at least this (Python and a kernel launch
    # per layer, which vLLM's CUDA graphs skip); the lent H100's transformers rollout took
    # about 2 s for 32 tokens of a tiny model, its reward and agent loop included
    "hf_decode_step_s": 0.03,
    "response_fill": 0.5,       # mean response length over the cap (short answers: less)
    "verl_start_s": 300.0,      # Ray, the actor's and vLLM's loads, CUDA graphs
    "trl_start_s": 60.0,        # the model's load, LoRA, CUDA's start
    "verl_step_overhead_s": 3.0,  # weight sync, TransferQueue and Ray calls per step
    "trl_step_overhead_s": 1.0,   # the optimizer step, reward and logging per step
    "vllm_eval_model_s": 120.0,  # eval's vLLM start-up per model
    "hf_eval_model_s": 30.0,    # eval's process and model load per model (transformers)
}


def forecast_run(setup: TrainSetup, work: StepWork, eval_params: EvalParams,
                 ) -> dict[str, Any]:
    """The forecast of the run ``work`` describes and of its eval: calibrated on a CPU,
    arithmetic on GPUs (module docstring)."""
    import pyarrow.parquet as pq

    from rl_pipeline.evaluation.generate import pick_backend, sampling_settings
    from rl_pipeline.params import resolve_followers

    val_rows = pq.ParquetFile(setup.val_prompts_file).metadata.num_rows
    # A bare call (not Kedro's hook) may hand eval's followers unresolved.
    eval_params = resolve_followers({"eval": eval_params, "train": setup.train,
                                     "data": setup.data, "reward": setup.reward})["eval"]
    sampling = sampling_settings(eval_params, setup.data)
    eval_work = EvalWork(prompts=min(eval_params.max_prompts or val_rows, val_rows),
                         sampling=sampling, batch_size=eval_params.batch_size,
                         dtype=eval_params.dtype,
                         backend=eval_params.backend if eval_params.backend != "auto"
                         else pick_backend("auto"))
    template = dict(setup.data.data_apply_chat_template_kwargs)
    price = setup.train.price_per_device_hour
    if work.device == "cpu":
        calibration = calibrate(setup.base_model, setup.train_prompts_file,
                                setup.val_prompts_file, work, eval_work, template)
        return forecast_cpu(work, calibration, eval_work, price)
    lora = work.lora or {}
    facts = ModelFacts.read(setup.base_model, lora.get("r", 0), lora.get("target_modules"))
    if facts is None:
        return {"basis": f"none: no config.json and safetensors at {setup.base_model} to "
                         "size the model by"}
    return forecast_gpu(work, facts, eval_work,
                        mean_prompt_tokens(setup.base_model, setup.train_prompts_file,
                                           template), price)


def mean_prompt_tokens(model_path: str, prompts_file: str, chat_template_kwargs: dict,
                       rows: int = 64) -> float:
    """The mean length of the first ``rows`` prompts, chat template applied, in tokens."""
    from rl_pipeline.engines.calibration import conversations
    from rl_pipeline.models.tokenizer import chat_prompt_ids, load_tokenizer

    tokenizer = load_tokenizer(model_path)
    ids = chat_prompt_ids(tokenizer, conversations(prompts_file, rows), **chat_template_kwargs)
    return sum(len(i) for i in ids) / max(1, len(ids))


def forecast_cpu(work: StepWork, calibration: Calibration, eval_work: EvalWork,
                 price_per_device_hour: float | None) -> dict[str, Any]:
    """The run's forecast from this machine's calibration (module docstring)."""
    costs = CPU_COSTS.get(work.engine, CPU_COSTS["trl"])
    scale = work.sequences / calibration.sequences  # the calibration batch may be smaller
    rollout = calibration.rollout_s * scale * work.rollouts_per_step
    log_probs = calibration.forward_s * scale * work.log_prob_passes
    update = ((calibration.update_s + (calibration.forward_s if work.recompute else 0.0))
              * scale * work.update_passes)
    step = {"rollout": rollout, "log_probs": log_probs, "update": update,
            "other": costs.step_s}
    validation = (work.validations * work.validation_prompts / calibration.sequences
                  * calibration.rollout_s)
    train_s = (costs.start_s + costs.first_step_s + work.steps * sum(step.values())
               + work.saves * costs.save_s + validation)
    # The calibrated batch is eval's first (a full one where there are enough prompts).
    eval_s = eval_work.models * (CPU_EVAL_MODEL_S + calibration.eval_batch_s * eval_work.prompts
                                 / min(eval_work.batch_size, eval_work.prompts))
    # Each rank holds the model; so does each rollout replica where it is a process.
    processes = work.devices + (work.devices // work.tensor_parallel
                                if costs.rollout_servers else 0)
    return _forecast(
        work, basis="calibrated on this machine", step=step, start_s=costs.start_s,
        first_step_s=sum(step.values()) + costs.first_step_s, train_s=train_s, eval_s=eval_s,
        peak_memory_gib=costs.memory_gib + processes * calibration.peak_rss_gib,
        devices=1, price=price_per_device_hour,
        notes={"response_tokens": round(calibration.response_tokens, 1),
               "calibration": calibration.as_dict(),
               "memory": f"{processes} process(es) holding the model, each at the "
                         f"calibration's peak, and {costs.memory_gib:g} GiB for the rest"})


def forecast_gpu(work: StepWork, facts: ModelFacts, eval_work: EvalWork, prompt_tokens: float,
                 price_per_device_hour: float | None, gpu_name: str | None = None,
                 ) -> dict[str, Any]:
    """The run's estimate on GPUs, from arithmetic (module docstring); ``facts``: the
    model's :class:`~rl_pipeline.models.facts.ModelFacts`, ``prompt_tokens``: the mean
    prompt length, ``gpu_name``: nvidia-smi's name (None: this machine's, else
    :data:`DEFAULT_GPU`)."""
    a = GPU_ASSUMPTIONS
    kind, found = gpu_kind(gpu_name if gpu_name is not None else local_gpu_name())
    peak = kind.tflops * 1e12
    bandwidth = kind.bandwidth_tb_s * 1e12
    n = facts.parameters
    weight_bytes = 2 * n  # bfloat16
    response = a["response_fill"] * work.response_cap
    replicas = max(1, work.devices // work.tensor_parallel)

    def rollout_s(sequences: float, replicas: int, tensor_parallel: int, backend: str,
                  response: float = response) -> float:
        per_replica = sequences / replicas
        prefill = 2 * n * per_replica * prompt_tokens / (tensor_parallel * peak
                                                         * a["prefill_mfu"])
        per_token = max(weight_bytes / tensor_parallel / (bandwidth * a["decode_bandwidth"]),
                        2 * n * per_replica / (tensor_parallel * peak * a["train_mfu"]),
                        a["hf_decode_step_s"] if backend == "hf" else 0.0)
        return prefill + response * per_token

    tokens = work.sequences * (prompt_tokens + response)
    flops_per_token = (4 if work.lora else 6) * n + (2 * n if work.recompute else 0)
    step = {
        "rollout": rollout_s(work.sequences, replicas, work.tensor_parallel,
                             work.rollout_backend) * work.rollouts_per_step,
        "log_probs": work.log_prob_passes * 2 * n * tokens / (work.devices * peak
                                                              * a["train_mfu"]),
        "update": work.update_passes * flops_per_token * tokens / (work.devices * peak
                                                                   * a["train_mfu"]),
        "other": _per_engine(a, "step_overhead_s", work.engine)}
    validation = work.validations * rollout_s(work.validation_prompts, replicas,
                                              work.tensor_parallel, work.rollout_backend)
    start_s = _per_engine(a, "start_s", work.engine)
    train_s = (start_s + work.steps * sum(step.values()) + validation)
    # vLLM schedules every sequence at once; transformers' generate works batch by batch
    # (eval.batch_size prompts, each with its samples).
    samples = eval_work.sampling.samples
    eval_response = a["response_fill"] * (eval_work.sampling.max_new_tokens
                                          or work.response_cap)
    if eval_work.backend == "hf":
        generate_s = eval_work.batches * rollout_s(
            min(eval_work.prompts, eval_work.batch_size) * samples, 1, 1, "hf", eval_response)
    else:
        generate_s = rollout_s(eval_work.prompts * samples, 1, 1, "vllm", eval_response)
    eval_s = eval_work.models * (a[f"{eval_work.backend}_eval_model_s"] + generate_s)
    peak_memory = work.gpu_peak_gib if work.gpu_peak_gib is not None else (
        # bfloat16 weights, and float32 weights and Adam moments of what is trained
        (weight_bytes + 12 * (facts.lora_parameters if work.lora else n)) / GiB
        + CUDA_CONTEXT_GIB)
    assumed = "" if found else f" (no GPU named here: assumed {kind.name})"
    return _forecast(
        work, basis=f"estimate: arithmetic for {kind.name}{assumed}, not yet calibrated by a "
                    "GPU run", step=step, start_s=start_s,
        first_step_s=sum(step.values()), train_s=train_s, eval_s=eval_s,
        peak_memory_gib=peak_memory, devices=work.devices, price=price_per_device_hour,
        notes={"gpu": kind.name, "assumptions": dict(a), "prompt_tokens": round(prompt_tokens),
               "response_tokens": round(response)})


def _per_engine(assumptions: dict[str, float], name: str, engine: str) -> float:
    """The engine's assumption (``trl_start_s``); an engine without one is costed as verl,
    the larger."""
    return assumptions.get(f"{engine}_{name}", assumptions[f"verl_{name}"])


def _forecast(work: StepWork, *, basis: str, step: dict[str, float], start_s: float,
              first_step_s: float, train_s: float, eval_s: float, peak_memory_gib: float,
              devices: int,
              price: float | None, notes: dict[str, Any]) -> dict[str, Any]:
    device_hours = devices * train_s / 3600 + eval_s / 3600
    return {
        "basis": basis, "device": work.device, "devices": devices, "steps": work.steps,
        "step_s": {k: round(v, 2) for k, v in {**step, "total": sum(step.values())}.items()},
        "start_s": round(start_s, 1), "first_step_s": round(first_step_s, 2),
        "train_s": round(train_s, 1), "eval_s": round(eval_s, 1),
        "peak_memory_gib": round(peak_memory_gib, 2),
        "disk_gib": round(work.checkpoint_gib * work.checkpoints_kept
                          + MERGE_COPIES * work.model_gib, 3),
        "device_hours": round(device_hours, 4),
        "cost": None if price is None else round(price * device_hours, 2),
        "price_per_device_hour": price, **notes}


def gpu_kind(name: str | None) -> tuple[GpuKind, bool]:
    """The :data:`GPU_KINDS` entry nvidia-smi's ``name`` matches, and whether one did (else
    :data:`DEFAULT_GPU`)."""
    for kind in GPU_KINDS:
        if name and kind.name.lower() in name.lower():
            return kind, True
    return next(k for k in GPU_KINDS if k.name == DEFAULT_GPU), False


def local_gpu_name() -> str | None:
    """The first GPU's name as nvidia-smi gives it, or None."""
    return nvidia_smi_query("name")


def forecast_lines(forecast: dict[str, Any]) -> str:
    """The forecast as the preflight log shows it."""
    step = forecast["step_s"]
    cost = ("" if forecast["cost"] is None else
            f", cost {forecast['cost']:.2f} at {forecast['price_per_device_hour']:g} per "
            f"device-hour")
    return (f"Forecast ({forecast['basis']}): {forecast['steps']} steps of {step['total']:.1f} s "
            f"(rollout {step['rollout']:.1f}, log-probs {step['log_probs']:.1f}, update "
            f"{step['update']:.1f}, other {step['other']:.1f}), training "
            f"{_duration(forecast['train_s'])} with {forecast['start_s']:.0f} s of start-up, "
            f"eval {_duration(forecast['eval_s'])}; peak memory "
            f"{forecast['peak_memory_gib']:.1f} GiB"
            f"{' per GPU' if forecast['device'] == 'cuda' else ''}, disk "
            f"{forecast['disk_gib']:.2f} GiB; {forecast['device_hours']:.2f} device-hours{cost}")


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours} h {minutes:02d} min" if hours else
            f"{minutes} min {secs:02d} s" if minutes else f"{secs} s")


def first_step_message(step: int, seconds: float, forecast_s: float) -> tuple[int, str]:
    """The log level and line after a run's first step, against the forecast."""
    message = f"step {step} took {seconds:.1f} s, forecast {forecast_s:.1f} s"
    if seconds > STEP_WARN_RATIO * forecast_s:
        return logging.WARNING, (f"{message}: {seconds / forecast_s:.1f}x the forecast. The "
                                 "machine may be busy, or slower than the calibration "
                                 "measured; the training time will be longer too")
    return logging.INFO, message


def forecast_metrics(forecast: dict[str, Any], actual_train_s: float,
                     steps_trained: int) -> dict[str, float]:
    """The train run's forecast and actual values with their ratio (actual over forecast).
    A resumed run is compared on the steps it trained: the forecast is scaled to them."""
    per_step = forecast["step_s"]["total"]
    forecast_train = (forecast["train_s"] - forecast["steps"] * per_step
                      + steps_trained * per_step)
    out = {"forecast/train_s": forecast_train, "actual/train_s": actual_train_s,
           "forecast/step_s": per_step}
    if forecast_train > 0:
        out["forecast/train_ratio"] = actual_train_s / forecast_train
    return {k: round(v, 4) for k, v in out.items()}
