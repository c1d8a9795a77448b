"""Boundary: the trl engine's generation settings pass vLLM 0.24's ``SamplingParams``.

With ``train.trl.use_vllm`` TRL builds vLLM's sampling parameters from its own and our
``GRPOConfig.generation_kwargs`` (``trl/generation/vllm_generation.py``, colocate mode;
server mode sends them to ``trl vllm-serve``, which does the same). vLLM's
``SamplingParams`` is a msgspec struct that refuses a keyword it does not know, so a
transformers-only setting there (``use_cache``, which the CPU rollout needs) ended every
vLLM run at its first generation, where no CPU test could see it. Here vLLM's own class,
from the parser folder of ``make vllm-parser``, takes what TRL would hand it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rl_pipeline.engines.trl.config import grpo_config
from rl_pipeline.engines.verl.vllm_args import parser_path, vllm_source
from rl_pipeline.params.trl import TrlParams

pytestmark = [pytest.mark.gpu_boundary, pytest.mark.slow]

SAMPLING = """
import json, sys
from vllm import SamplingParams
for kwargs in json.loads(sys.argv[1]):
    try:
        SamplingParams(**kwargs)
        print("OK")
    except TypeError as exc:
        print(f"REFUSED {exc}")
"""


def _colocate_kwargs(config) -> dict:
    """What TRL 1.12's colocate generation passes to ``SamplingParams``
    (``VLLMGeneration._generate``, mode colocate): its own settings, then ours."""
    return {"n": 1, "repetition_penalty": config.repetition_penalty,
            "temperature": config.temperature, "top_p": config.top_p,
            "top_k": config.top_k if config.top_k is not None else -1,
            "min_p": 0.0 if config.min_p is None else config.min_p,
            "max_tokens": config.max_completion_length, "logprobs": 0,
            **(config.generation_kwargs or {})}


def test_trls_vllm_sampling_parameters_are_ones_vllm_takes(tmp_path) -> None:
    source = vllm_source()
    assert source is not None, "run `make vllm-parser`"
    # bf16=False only because this test runs where there is no GPU.
    on_gpu = grpo_config(TrlParams(use_vllm=True), str(tmp_path), use_cpu=False, bf16=False)
    on_cpu = grpo_config(TrlParams(use_vllm=True), str(tmp_path), use_cpu=True)
    assert on_gpu.use_vllm and not on_cpu.use_vllm
    # The CPU rollout is transformers' generate, which needs the cache turned on there.
    assert on_cpu.generation_kwargs == {"use_cache": True}
    env = dict(os.environ)
    if source != "installed":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(parser_path()),
                                                          env.get("PYTHONPATH")]))
    probes = [_colocate_kwargs(on_gpu), _colocate_kwargs(on_cpu)]
    result = subprocess.run([sys.executable, "-c", SAMPLING, json.dumps(probes)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith(("OK", "REFUSED"))]
    # The GPU configuration passes; the probe itself would see a refusal (the CPU one's).
    assert lines == ["OK", "REFUSED Unexpected keyword argument 'use_cache'"], result.stdout
