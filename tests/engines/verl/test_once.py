"""verl's per-sample warnings, once per process, in every Ray process of every verl run
(rl_pipeline.engines.verl.once, loaded by verl's plugin hook as each process imports verl)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rl_pipeline.engines.verl.config import CPU_MODULE, ONCE_MODULE
from rl_pipeline.engines.verl.plan import plan_verl
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from tests.engines.verl.cpu_job import CPU_VERL
from tests.verl_inputs import SMALL

# What verl's agent loop does for each sample, in a process that imported verl as a Ray
# process of the run does (the plugin hook reads VERL_USE_EXTERNAL_MODULES there).
PROBE = """
import verl
from verl.utils.tokenizer.continuous_token_wiring import infer_continuous_token_model_family
for _ in range(12):  # a step's samples of a Llama (SmolLM2, conf/cpu's model)
    infer_continuous_token_model_family(hf_model_type="llama")
infer_continuous_token_model_family(hf_model_type="gpt_neox")  # another message
"""
WARNING = "No model-specific Continuous Token builder is registered"


def _hooked_modules(verl: VerlParams, inputs) -> str:
    plan = plan_verl(verl, DataParams(), RewardParams(), inputs, gpus_visible=0,
                     training=False, train_rows=16)
    return plan.config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES


def _warnings(modules: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    if modules is not None:
        env["VERL_USE_EXTERNAL_MODULES"] = modules
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [line for line in result.stderr.splitlines() if WARNING in line]


@pytest.mark.slow  # verl imported in two fresh processes
def test_every_verl_run_logs_verls_per_sample_warning_once_per_process(inputs) -> None:
    # The vLLM rollout on GPUs (the base configuration) and the CPU mode.
    on_gpus = _hooked_modules(VerlParams(**SMALL), inputs)
    assert on_gpus == ONCE_MODULE
    assert _hooked_modules(VerlParams(**CPU_VERL), inputs) == f"{ONCE_MODULE},{CPU_MODULE}"
    warned = _warnings(on_gpus)
    assert len(warned) == 2, warned
    assert "model_type='llama'" in warned[0] and "model_type='gpt_neox'" in warned[1]
    assert len(_warnings(None)) == 13  # verl on its own: a line per sample
