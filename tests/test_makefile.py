"""The Makefile's two install paths, read with `make -n` (nothing runs): a stand-in
nvidia-smi on PATH decides which one make takes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _dry_run(tmp_path: Path, *, gpu: bool) -> str:
    stand_in = tmp_path / "bin" / "nvidia-smi"
    stand_in.parent.mkdir()
    # What nvidia-smi -L prints with one GPU; exit 9 is what it gives without a driver.
    stand_in.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n"
                        if gpu else "#!/bin/sh\nexit 9\n")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_in.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("ENV", None)
    result = subprocess.run(["make", "-n", "-B", "install", "run"], cwd=PROJECT_ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_gpu_machine_installs_the_locked_gpu_stack(tmp_path) -> None:
    commands = _dry_run(tmp_path, gpu=True)
    assert "python3.12 -m venv .venv" in commands
    assert '-c requirements/gpu.lock -e ".[gpu,dev]"' in commands
    assert "torch==2.13.0" not in commands and "constraints-cpu.txt" not in commands
    assert "kedro run --pipelines __default__ --env local" in commands


def test_a_cpu_machine_keeps_the_cpu_path(tmp_path) -> None:
    commands = _dry_run(tmp_path, gpu=False)
    assert "python3.11 -m venv .venv" in commands
    assert '-c constraints-cpu.txt "torch==2.13.0"' in commands
    assert '-c constraints-cpu.txt -e ".[dev]"' in commands
    assert "gpu.lock" not in commands
    assert "kedro run --pipelines __default__ --env cpu" in commands
