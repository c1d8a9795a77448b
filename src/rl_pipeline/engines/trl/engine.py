"""The trl engine: GRPO (or REINFORCE++ advantages) with TRL's GRPOTrainer, on CPU or GPU.

It takes what the verl engine takes (the prompt parquet in verl's schema, the base model,
the ``reward`` group's function) and gives what it gives (checkpoints, a training result, a
summary), so merge and eval do not care which engine trained. :class:`TrlEngine` is the
:class:`~rl_pipeline.engines.base.Engine` the train nodes call; the sub-package's modules hold
the dataset and reward adapters (``inputs``), the MLflow callback (``callbacks``), the
preflight, the training loop (``train``), the REINFORCE++ trainer (``reinforce_pp``) and the
export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from rl_pipeline.engines.base import Engine, Preflight, TrainRun, TrainSetup
from rl_pipeline.engines.trl.checkpoints import last_checkpoint
from rl_pipeline.engines.trl.export import export_result
from rl_pipeline.engines.trl.preflight import plan_trl, step_work
from rl_pipeline.engines.trl.train import train_trl
from rl_pipeline.runs.command import stage_command


class TrlEngine(Engine):
    """TRL's GRPOTrainer in the Kedro node's process (CPU or GPU)."""

    name = "trl"

    def preflight(self, setup: TrainSetup, *, training: bool) -> Preflight:
        params = setup.train.trl
        report, config_yaml = plan_trl(params, setup.reward, setup.train_prompts_file,
                                       setup.base_model, setup.checkpoints_dir,
                                       setup.train_rows)
        # TRL has no launcher of its own: the same launch is the train stage, run with this
        # command's environment and parameters.
        command = ("# The trl engine trains inside the Kedro node (no launcher of its own); "
                   "this stage again:\n" + (stage_command("train") or
                   "# (with this run's --env and --params: the train run's kedro_command tag)\n"
                   "kedro run --pipelines train") + "\n")
        return Preflight(plan={"engine": self.name}, report=report, config_yaml=config_yaml,
                         command=command,
                         work=step_work(params, setup.train_rows, setup.base_model))

    def train(self, plan: dict[str, Any], setup: TrainSetup, train_prompts: pd.DataFrame,
              val_prompts: pd.DataFrame, run_id: str | None) -> TrainRun:
        run = train_trl(setup.train.trl, setup.reward, train_prompts,
                        val_prompts, setup.base_model, setup.checkpoints_dir,
                        resume=setup.train.resume,
                        rollouts_per_step=setup.train.rollouts_logged_per_step,
                        first_step_forecast_s=(plan.get("forecast") or {}).get(
                            "first_step_s"))
        run.summary["mlflow_run_id"] = run_id
        return run

    def checkpointed_step(self, checkpoints_dir: Path) -> int:
        last = last_checkpoint(checkpoints_dir)
        return int(last.name.rsplit("-", 1)[-1]) if last else 0

    def export(self, run: TrainRun, scratch_dir: Path) -> Path:
        return export_result(run, scratch_dir)
