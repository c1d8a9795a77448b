"""The ``train`` parameter group: the engine and each engine's settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from rl_pipeline.params.base import ParamGroup
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.params.verl import VerlParams

# The engine table: ``train.engine`` name -> "module:class" of its Engine, imported on first
# use (rl_pipeline.engines.lookup). Here, not in engines/, so that validating ``train.engine``
# imports nothing above the parameters. A new engine is a sub-package and a line here.
ENGINES: dict[str, str] = {
    "verl": "rl_pipeline.engines.verl.engine:VerlEngine",
    "trl": "rl_pipeline.engines.trl.engine:TrlEngine",
}


class TrainParams(ParamGroup):
    """``train``: which engine trains, and each engine's parameters."""

    group: ClassVar[str] = "train"

    engine: str = Field(
        "verl", description="verl (GPUs, vLLM rollout), trl (CPU or GPU), another engine of "
        "rl_pipeline.params.train.ENGINES, or auto: verl when CUDA GPUs and vLLM are present, "
        "else trl.")
    ray_address: str | None = Field(
        None, description="verl: an existing Ray cluster ('auto', 'ray://host:10001'); null "
        "uses RAY_ADDRESS when set, else starts a local Ray. Set it in conf/local or in the "
        "environment's parameters (conf/multinode: auto).")
    shared_root: str | None = Field(
        None, description="verl on a Ray cluster: a folder every node mounts at the same path "
        "(NFS, Lustre, ...). Required there: the prompts, the base model, the checkpoints and "
        "a custom reward file must lie under it (preflight checks, following symlinks).")
    ray_placement_timeout_s: float | None = Field(
        600.0, gt=0, description="verl: how long its workers may wait for their GPUs and CPUs "
        "on Ray before the run stops, naming what could not be placed and what each node has "
        "(verl itself waits forever: a node whose GPUs another job holds hangs the run). null: "
        "wait as long as it takes (an autoscaling cluster that adds nodes on demand).")
    resume: str = Field(
        "auto", description="auto: a rerun of the same run identity (base model, training "
        "prompts, engine parameters, data and reward settings) resumes from its newest "
        "checkpoint, or trains no further when it is complete; another identity trains "
        "afresh in a folder of its own. never: discard this identity's checkpoints and train "
        "afresh. A path: resume from that checkpoint (trl's checkpoint-N, verl's "
        "global_step_N), whatever run wrote it.")
    rollouts_logged_per_step: int = Field(
        4, ge=0, description="Rollouts of each training step kept in the train run's MLflow "
        "table train/rollouts.json (prompt, response, reward and its parts, with the step): "
        "the first ones of the step, a whole group when it is the group size. 0: none. "
        "The step's degeneration rates are logged over all of its rollouts either way.")
    forecast: bool = Field(
        True, description="Preflight forecasts the run's time per step, training and eval "
        "time, peak memory, disk and cost (docs/benchmarks.md, 'Forecast against actual'). "
        "On a CPU it first measures this machine on the configured model: one step's "
        "rollout, a forward and a backward pass, an eval batch (about 20 s with SmolLM2 on "
        "2 cores); on GPUs it is arithmetic on documented assumptions, an estimate. false: "
        "no forecast.")
    price_per_device_hour: float | None = Field(
        None, ge=0, description="What a device-hour costs (a GPU's, or the machine's on a "
        "CPU), in any currency: the forecast's cost is device-hours times it. null: no cost.")
    verl: VerlParams = Field(default_factory=VerlParams, description="The verl engine.")
    trl: TrlParams = Field(default_factory=TrlParams, description="The trl engine.")

    @field_validator("resume")
    @classmethod
    def _resume_point(cls, value: str) -> str:
        if value in ("auto", "never"):
            return value
        folder = Path(value)
        if not folder.is_dir() or not re.fullmatch(r"(checkpoint-|global_step_)\d+",
                                                    folder.name):
            raise ValueError(f"auto, never, or a checkpoint folder (checkpoint-N of trl, "
                             f"global_step_N of verl); {value!r} is "
                             + ("not a folder" if not folder.is_dir() else "not named so"))
        return str(folder.resolve())

    def not_in_effect(self) -> set[str]:
        """The groups of the engines this run does not train with (both with ``auto``)."""
        if self.engine not in ENGINES:
            return set()
        return {name for name in ENGINES if name != self.engine and name in type(self).model_fields}

    @field_validator("engine")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value != "auto" and value not in ENGINES:
            raise ValueError(f"one of {', '.join([*ENGINES, 'auto'])}")
        return value

