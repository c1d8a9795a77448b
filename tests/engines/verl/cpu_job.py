"""One verl training run on this CPU, as the train node launches it: ``python -m
tests.engines.verl.cpu_job <job.json>``. A process of its own, so that a test can SIGKILL it
(and the Ray it started) mid-run.

The job file names the prompts, the model, the checkpoint folder, the MLflow store and run,
and the settings; the summary (or the error) goes to ``<job>.out.json``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path

from rl_pipeline.cli import _stops_raise
from rl_pipeline.engines.verl.config import LaunchInputs, first_step_override
from rl_pipeline.engines.verl.engine import train_verl
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.errors import terminated
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams

# Small enough for 2 cores, big enough for GRPO: 4 prompts x 4 completions a step.
# ENGINE left unset: the device decides the rollout (hf).
CPU_VERL = {"device": "cpu", "trainer_n_gpus_per_node": "auto",
            "rollout_tensor_model_parallel_size": "auto",
            "actor_fsdp_config_offload_policy": False, "data_train_batch_size": 4,
            "rollout_n": 4, "actor_ppo_mini_batch_size": 4,
            "actor_ppo_micro_batch_size_per_gpu": 4,
            "rollout_log_prob_micro_batch_size_per_gpu": 4,
            "ref_log_prob_micro_batch_size_per_gpu": 4, "actor_model_lora_rank": 8,
            "rollout_dtype": "float32",
            "actor_model_lora_alpha": 16, "actor_model_lora_dropout": 0.05,
            "trainer_save_freq": 1, "trainer_test_freq": -1,
            "trainer_val_before_train": False}


def main(job_file: str) -> None:
    import mlflow

    job = json.loads(Path(job_file).read_text())
    mlflow.set_tracking_uri(job["tracking_uri"])
    inputs = LaunchInputs(train_files=job["train_files"], val_files=job["val_files"],
                          model_path=job["model_path"], checkpoints_dir=job["checkpoints"],
                          tracking_uri=job["tracking_uri"], rollouts_per_step=4)
    verl = VerlParams(**{**CPU_VERL, **job["verl"]})
    reward = RewardParams(self_test="off", custom_reward_function=job["reward"])
    plan = plan_verl(verl, DataParams(data_max_response_length=32), reward, inputs,
                     gpus_visible=0, training=True, train_rows=16)
    out = Path(job_file + ".out.json")
    # As `kedro run` trains: SIGTERM and SIGHUP raise Terminated (rl_pipeline.cli)
    stops = _stops_raise() if job.get("stops_raise") else contextlib.nullcontext()
    try:
        with stops:
            forecast = job.get("first_step_forecast_s")
            try:
                run = train_verl([*plan.overrides, *first_step_override(forecast)],
                                 job["run_id"], max_probs_diff=verl.rollout_max_probs_diff,
                                 min_probs_pearson=verl.rollout_min_probs_pearson)
            finally:  # what train_verl left installed, before _stops_raise puts back its own
                handlers = {s.name: _name(signal.getsignal(s))
                            for s in (signal.SIGTERM, signal.SIGHUP)}
    except Exception as exc:  # the test reads what stopped it
        stop = terminated(exc)
        out.write_text(json.dumps({"error": type(exc).__name__, "message": str(exc),
                                   "terminated": str(stop) if stop else None,
                                   "handlers": handlers}))
        if stop is not None:
            raise SystemExit(128 + stop.signum) from None
        raise
    out.write_text(json.dumps({"summary": run.summary, "history": run.history}, default=str))


def _name(handler: object) -> str:
    return getattr(handler, "__name__", None) or getattr(handler, "name", None) or str(handler)


if __name__ == "__main__":
    main(sys.argv[1])
