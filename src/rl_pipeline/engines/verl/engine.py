"""The verl engine: its preflight (:mod:`.plan`), then ``run_ppo`` on Ray, then the export
(:mod:`.checkpoint`).

:class:`VerlEngine` is the :class:`~rl_pipeline.engines.base.Engine` the train nodes call.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rl_pipeline.engines.base import (
    BAND_MAX,
    BAND_MIN,
    BAND_STD,
    Engine,
    Preflight,
    TrainRun,
    TrainSetup,
)
from rl_pipeline.engines.verl.checkpoint import (
    drop_unkept,
    export_result,
    latest_step,
    repair_latest,
)
from rl_pipeline.engines.verl.config import (
    TRAINER_SETTINGS,
    LaunchInputs,
    command_line,
    compose_verl_config,
    first_step_override,
    judge_overrides,
    run_id_override,
)
from rl_pipeline.engines.verl.failures import (
    PlacementWatch,
    WorkerDeviceError,
    WorkerPlacementError,
    explain_worker_failure,
    worker_placement,
)
from rl_pipeline.engines.verl.plan import (
    plan_verl,
    planned_steps,
    resolved_config_yaml,
    step_work,
)
from rl_pipeline.engines.verl.rollout_check import check_rollout_policy, read_agreement
from rl_pipeline.engines.verl.stop_signals import StopHandlers
from rl_pipeline.errors import terminated

logger = logging.getLogger(__name__)


def train_verl(overrides: list[str], run_id: str | None,
               placement_timeout_s: float | None = None,
               max_probs_diff: float | None = None,
               min_probs_pearson: float | None = None) -> TrainRun:
    """Launch verl's ``run_ppo`` with its TaskRunner on Ray.

    verl starts a local Ray unless the overrides name a cluster (``ray_kwargs.ray_init.
    address``), applying its own runtime_env merged with ours (MLflow, pip). With
    ``MLFLOW_RUN_ID`` verl's per-step metrics land in the train stage's MLflow run.
    With ``train.resume=auto`` (``trainer.resume_mode=auto`` in the run identity's own
    folder) a rerun continues from the newest checkpoint, and a complete run trains no
    further; afterwards the newest checkpoint must be the planned last step.
    A Ray that verl started is shut down when it ends, whether it succeeded or failed.

    Args:
        overrides: The checked overrides (:attr:`VerlPlan.overrides`).
        run_id: The train stage's MLflow run, or None.
        placement_timeout_s: How long verl's workers may wait to be placed on Ray (None:
            as long as it takes, verl's own behaviour).
        max_probs_diff: ``train.verl.rollout_max_probs_diff``: the largest mean gap between
            the rollout's and the actor's token probabilities at any step (None: no check).
        min_probs_pearson: ``train.verl.rollout_min_probs_pearson``: their smallest
            correlation at any step (None: no check).

    Raises:
        WorkerDeviceError: When verl's workers failed on nodes without the CUDA devices Ray
            declares there (the nodes named; verl's error chained).
        WorkerPlacementError: When they were not placed within ``placement_timeout_s``.
        RolloutPolicyError: When the rollout sampled another policy than the actor trained.

    Returns:
        The run; its history is verl's mean score per step, read back from MLflow.
    """
    import ray
    from verl.trainer.main_ppo import run_ppo

    config = compose_verl_config([*overrides, *([run_id_override(run_id)] if run_id else []),
                                  *judge_overrides()])
    checkpoints = Path(config.trainer.default_local_dir)
    if config.trainer.resume_mode == "auto":
        repair_latest(checkpoints)  # verl's own resume raised on an empty record
    planned = planned_steps(config)
    resumed_from = latest_step(checkpoints) if config.trainer.resume_mode == "auto" else 0
    if config.trainer.resume_mode == "resume_path":
        resumed_from = int(Path(config.trainer.resume_from_path).name.rsplit("_", 1)[-1])
    summary = {"engine": "verl", "planned_steps": planned, "resumed_from_step": resumed_from,
               "already_complete": False, "checkpoints": str(checkpoints),
               "mlflow_run_id": run_id, "command": command_line(overrides),
               "lora": config.actor_rollout_ref.model.lora_rank > 0}
    if config.trainer.resume_mode == "auto" and resumed_from >= planned:
        logger.info("The run in %s is complete (step %d of %d): nothing to train; its result "
                    "is exported again (train.resume=never trains it afresh)", checkpoints,
                    resumed_from, planned)
        return TrainRun(summary={**summary, "steps": resumed_from, "seconds": 0.0,
                                 "already_complete": True}, history=[], checkpoints=checkpoints)
    if resumed_from:
        logger.info("Resuming from step %d in %s", resumed_from, checkpoints)
    _write_initial_adapter(config)
    started = time.perf_counter()
    own_ray = not ray.is_initialized()  # run_ppo starts a local Ray unless one is running
    watch = PlacementWatch(placement_timeout_s)
    handlers = StopHandlers()
    try:
        with watch, handlers.across_ray_init():
            if config.trainer.device == "cpu":
                from rl_pipeline.engines.verl.cpu.trainer import CPUTaskRunner

                run_ppo(config, task_runner_class=CPUTaskRunner)
            elif config.trainer.use_v1:
                from rl_pipeline.engines.verl.trainer import PipelineTaskRunner

                run_ppo(config, task_runner_class=PipelineTaskRunner)
            else:  # LEGACY_TRAINER_ESTIMATORS (remax)
                from verl.trainer.main_ppo_v0 import TaskRunner

                run_ppo(config, task_runner_class=TaskRunner)
        if OmegaConf.select(config, "ray_kwargs.ray_init.address") not in (None, "local"):
            # A cluster: where each rank ran, for the summary and the log.
            summary["placement"] = worker_placement()
            logger.info("verl's ranks ran on: %s", ", ".join(
                f"rank {p['rank']} on {p['node']}" for p in summary["placement"]) or "unknown")
    except Exception as exc:
        if watch.reason:
            raise WorkerPlacementError(watch.reason) from exc
        # verl's error is a worker's traceback (NCCL, CUDA) that does not say which node.
        # (On a CPU run there are no CUDA devices to look for.)
        explanation = (explain_worker_failure() if ray.is_initialized() and not
                       terminated(exc) and config.trainer.device != "cpu" else None)
        if explanation:
            raise WorkerDeviceError(explanation) from exc
        raise
    finally:
        # The workers (FSDP actor, vLLM engines) hold GPU memory until Ray stops them; merge
        # and eval run next in this process and need it back.
        if own_ray and ray.is_initialized():
            ray.shutdown()
        handlers.restore()  # ray.init's stay after ray.shutdown: merge and eval run next
    summary.update(steps=latest_step(checkpoints),
                   seconds=round(time.perf_counter() - started, 1))
    check_step_count(checkpoints, planned, resumed_from)
    drop_unkept(checkpoints, config.trainer.get("max_actor_ckpt_to_keep"))
    history = _reward_history(run_id) if run_id else []
    if run_id and summary["steps"] > resumed_from and not history:
        # verl's MLflow logger swallows its start-up errors (an unreachable tracking URI).
        uri = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars."
                               "MLFLOW_TRACKING_URI")
        raise RuntimeError(f"verl trained steps {resumed_from + 1}-{summary['steps']} but none "
                           f"of its per-step metrics reached MLflow run {run_id} at {uri}"
                           ": the workers could not reach the tracking store (on a Ray cluster "
                           "use a tracking server, conf/local/README.md). The checkpoints are "
                           f"in {checkpoints}.")
    if run_id and summary["steps"] > resumed_from and (
            max_probs_diff is not None or min_probs_pearson is not None):
        summary["rollout_policy"] = check_rollout_policy(
            read_agreement(run_id), max_probs_diff, min_probs_pearson, str(checkpoints))
    return TrainRun(summary=summary, history=history, checkpoints=checkpoints)


def _write_initial_adapter(config: Any) -> None:
    """The adapter verl starts from when ``train.verl.actor_model_lora_dropout`` is set
    (:mod:`rl_pipeline.engines.verl.lora`): written before verl's workers read it."""
    from rl_pipeline.engines.verl.lora import write_initial_adapter

    dropout = (OmegaConf.select(config, TRAINER_SETTINGS) or {}).get("lora_dropout")
    if not dropout:
        return
    model = config.actor_rollout_ref.model
    write_initial_adapter(Path(model.lora_adapter_path), model.path, model.lora_rank,
                          model.lora_alpha, dropout, model.target_modules,
                          model.get("exclude_modules"),
                          config.actor_rollout_ref.actor.fsdp_config.seed)


def check_step_count(checkpoints: Path, planned: int, resumed_from: int) -> None:
    """verl ended where it planned to, or fail loudly.

    verl resumed from a checkpoint saved at an epoch boundary can skip an epoch and exit 0
    (verl issue #7401); its last checkpoint then stops short of the planned steps.

    Raises:
        RuntimeError: Naming the steps planned, resumed from and reached.
    """
    reached = latest_step(checkpoints)
    if reached != planned:
        raise RuntimeError(
            f"verl planned {planned} steps and, resumed from step {resumed_from}, its newest "
            f"checkpoint in {checkpoints} is step {reached}: {planned - reached:+d} steps "
            "were not run (verl issue #7401: a resume from an epoch boundary can skip an "
            "epoch and still exit 0). The checkpoints are kept; rerun to resume, or "
            "train.resume=never to train afresh. With trainer_save_freq set, the last step "
            "is always saved.")


def _reward_history(run_id: str) -> list[dict[str, float]]:
    """The run's reward per step as :func:`~rl_pipeline.engines.base.reward_curve` reads it:
    verl's mean sequence score (``critic/score/mean``, GRPO's included) and our trainer's
    spread of the step's rewards."""
    import mlflow

    client = mlflow.MlflowClient()
    steps: dict[int, dict[str, float]] = {}
    for metric, key in (("critic/score/mean", "reward"), (BAND_STD, BAND_STD),
                        (BAND_MIN, BAND_MIN), (BAND_MAX, BAND_MAX)):
        for m in client.get_metric_history(run_id, metric):
            steps.setdefault(m.step, {"step": m.step})[key] = m.value
    return [row for _, row in sorted(steps.items()) if "reward" in row]


class VerlEngine(Engine):
    """verl's PPO trainer on Ray: FSDP actor, vLLM rollout, LoRA (GPUs only)."""

    name = "verl"

    def preflight(self, setup: TrainSetup, *, training: bool) -> Preflight:
        import mlflow
        import torch

        gpus = torch.cuda.device_count()
        params = setup.train
        inputs = LaunchInputs(
            train_files=setup.train_prompts_file, val_files=setup.val_prompts_file,
            model_path=str(Path(setup.base_model).absolute()),
            checkpoints_dir=setup.checkpoints_dir,
            tracking_uri=tracking_uri_for_workers(mlflow.get_tracking_uri()),
            ray_address=params.ray_address or os.environ.get("RAY_ADDRESS") or None,
            shared_root=params.shared_root, resume=params.resume,
            rollouts_per_step=params.rollouts_logged_per_step)
        plan = plan_verl(params.verl, setup.data, setup.reward, inputs, gpus_visible=gpus,
                         training=training, train_rows=setup.train_rows,
                         contact_cluster=True)
        return Preflight(
            plan={"engine": self.name, "overrides": plan.overrides},
            report={**plan.report, "overrides": plan.overrides, "command": plan.command},
            config_yaml=resolved_config_yaml(plan), command=plan.command + "\n",
            metrics={"resolved_trainer_n_gpus_per_node": plan.hardware.gpus_per_node,
                     "resolved_trainer_nnodes": plan.hardware.nnodes,
                     "resolved_rollout_tensor_model_parallel_size":
                         plan.hardware.tensor_parallel},
            work=step_work(plan.config, plan.report.get("host", {}), params.verl))

    def train(self, plan: dict[str, Any], setup: TrainSetup, train_prompts: Any,
              val_prompts: Any, run_id: str | None) -> TrainRun:
        # verl reads the prompt files itself (plan["overrides"] name them).
        forecast = (plan.get("forecast") or {}).get("first_step_s")
        return train_verl([*plan["overrides"], *first_step_override(forecast)], run_id,
                          placement_timeout_s=setup.train.ray_placement_timeout_s,
                          max_probs_diff=setup.train.verl.rollout_max_probs_diff,
                          min_probs_pearson=setup.train.verl.rollout_min_probs_pearson)

    def checkpointed_step(self, checkpoints_dir: Path) -> int:
        return latest_step(checkpoints_dir)

    def export(self, run: TrainRun, scratch_dir: Path) -> Path:
        return export_result(run.checkpoints, scratch_dir, run.summary)


def tracking_uri_for_workers(uri: str | None) -> str | None:
    """The tracking URI with a relative SQLite or file path made absolute.

    verl's MLflow logger runs in a Ray actor whose working directory is not the project's.
    """
    if not uri:
        return None
    for prefix in ("sqlite:///", "file://"):
        if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
            return prefix + str(Path(uri[len(prefix):]).absolute())
    if "://" not in uri and not os.path.isabs(uri):
        return str(Path(uri).absolute())
    return uri


