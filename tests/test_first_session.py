"""docs/gpu.md's first session, run word for word on this CPU machine as far as a CPU goes:
`make install` (a no-op where .venv is current), data_prep and the preflight of the smoke
configuration, with MODEL set to a local model folder as the docs say for an offline box."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT
from tests.projects import make_project, run_env

pytestmark = pytest.mark.slow

MARKER = "<!-- first-session -->"


def first_session() -> list[str]:
    """The command lines of the block after the marker (comments dropped)."""
    text = (PROJECT_ROOT / "docs/gpu.md").read_text()
    block = re.search(re.escape(MARKER) + r"\s*```bash\n(.*?)```", text, re.S)
    assert block, f"docs/gpu.md has no bash block after {MARKER}"
    return [line.split("  #", 1)[0].strip() for line in block[1].splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_first_session_is_the_smoke_configuration_in_a_venv() -> None:
    lines = first_session()
    assert lines[0].startswith("nvidia-smi --query-gpu=") and "driver_version" in lines[0]
    assert "make install" in lines  # the venv and the lock, not a bare pip install
    assert not any(re.search(r"\bpip install\b", line) for line in lines)
    kedro = [line for line in lines if "kedro run " in line]
    assert [re.search(r"--pipelines (\w+)", k)[1] for k in kedro] == [
        "data_prep", "preflight", "train", "merge", "eval"]
    assert all("--env smoke" in k and k.startswith(".venv/bin/kedro") for k in kedro)


def test_the_first_session_runs_as_written_through_preflight(tmp_path, tiny_model_dir) -> None:
    project = make_project(tmp_path)
    # The clone: what `make install` reads, with the times git gave them (an up-to-date
    # .venv stays as it is), and this checkout's .venv in its place.
    for name in ("Makefile", "pyproject.toml", "constraints-cpu.txt"):
        shutil.copy2(PROJECT_ROOT / name, project / name)
    shutil.copytree(PROJECT_ROOT / "requirements", project / "requirements",
                    copy_function=shutil.copy2)
    os.symlink(PROJECT_ROOT / ".venv", project / ".venv")
    lines = first_session()
    start = lines.index("make install")
    stop = next(i for i, line in enumerate(lines) if "--pipelines preflight" in line)
    script = "\n".join(["set -euo pipefail", *lines[start:stop + 1]])
    # MODEL is the docs' offline case: a local folder (the docs' export sets the hub id).
    script = script.replace("export MODEL=Qwen/Qwen2.5-0.5B-Instruct",
                            f"export MODEL={tiny_model_dir}")
    assert f"export MODEL={tiny_model_dir}" in script
    result = subprocess.run(["bash", "-c", script], cwd=project, capture_output=True,
                            text=True, timeout=900, env=run_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((project / "data/08_reporting/preflight_report.json").read_text())
    assert report["engine"] == "verl" and report["training"] is False
    assert report["hardware"] == {"gpus_per_node": 1, "nnodes": 1, "tensor_parallel": 1,
                                  "device": "cuda"}
    # The smoke run is small: a few steps, one small validation, one checkpoint kept.
    plan = report["host"]["plan"]
    assert plan["steps"] == 4 and plan["validations"] == 1
    assert plan["validation_prompts"] == 64 and plan["checkpoints_kept"] == 1
    assert report["host"]["gpu_memory"]["gpu_gib"] == 24
    assert report["host"]["gpu_memory"]["actor_peak_gib"] < 24
    assert report["host"]["ray_cpus_needed"] == 3 + 1 + 2 + 1
