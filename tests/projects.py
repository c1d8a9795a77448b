"""Scratch copies of the project, and real `kedro run` processes in them.

The tests that need a whole run (tests/test_run.py, tests/test_faults.py,
tests/test_scheduling.py) run the real CLI in a copy of the project's configuration, with
the real GSM8K files linked in; the package itself is the installed one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog

from tests.conftest import PROJECT_ROOT, resolved_cache_dir

FAULT_INJECTION = Path(__file__).parent / "fault_injection"


def make_project(root: Path) -> Path:
    """A copy of the project's configuration with the raw data and model linked in."""
    project = root / "project"
    project.mkdir()
    shutil.copy(PROJECT_ROOT / "pyproject.toml", project)
    shutil.copytree(PROJECT_ROOT / "conf", project / "conf",
                    ignore=shutil.ignore_patterns("local"))
    # Share the session's resolved-model cache, so SmolLM2's GGUF is converted once.
    folders = project / "conf/base/globals.yml"
    folders.write_text(folders.read_text().replace("resolved_models: data/06_models/resolved",
                                                   f"resolved_models: {resolved_cache_dir()}"))
    # No forecast (its calibration: 10-25 s of a run with SmolLM2) unless a test asks for it
    # (--params train.forecast=true): the tests of other things would pay for it.
    train = project / "conf/base/parameters_train.yml"
    text = train.read_text().replace("\ntrain: {}\n", "\ntrain: {forecast: false}\n")
    assert "forecast: false" in text, f"{train} no longer ends in 'train: {{}}'"
    train.write_text(text)
    (project / "conf/local").mkdir()
    shutil.copytree(PROJECT_ROOT / "scripts", project / "scripts")
    (project / "src").mkdir()  # the package itself is installed in the environment
    (project / "data").mkdir()
    (project / "data/01_raw").symlink_to(PROJECT_ROOT / "data/01_raw")
    return project


def generate_dags(project: Path, folder: Path, env: str | None = None) -> list[Path]:
    """`make airflow-dags` (for the Kedro environment ``env``; None: local), into ``folder``."""
    done = subprocess.run(
        [sys.executable, "-m", "kedro", "airflow", "create", "--pipelines",
         "__default__,data_prep,train,merge,eval,promote", "--group-by", "memory", "--jinja-file",
         str(PROJECT_ROOT / "templates/airflow_dag.j2"), "--target-dir", str(folder),
         *(["--env", env] if env else [])],
        cwd=project, capture_output=True, text=True, env=run_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted(folder.glob("*.py"))


def run_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "KEDRO_DISABLE_TELEMETRY": "true", "COLUMNS": "200", **extra}


def kedro_command(*args: str, env: str | None = "cpu") -> list[str]:
    """``env=None`` runs the base (GPU) configuration."""
    return [sys.executable, "-m", "kedro", "run", *(["--env", env] if env else []), *args]


def kedro_run(project: Path, *args: str, env: str | None = "cpu") -> subprocess.CompletedProcess:
    """`kedro run` in ``project``, to its end."""
    return run_command(project, kedro_command(*args, env=env))


def scheduled_command(stage: str, *args: str) -> list[str]:
    """scripts/scheduled_run.sh (copied into the project by :func:`make_project`), with this
    interpreter and the CPU environment."""
    return ["env", f"PYTHON={sys.executable}", "KEDRO_ENV=cpu", "bash",
            "scripts/scheduled_run.sh", stage, *args]


def run_command(project: Path, command: list[str], **extra_env: str
                ) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=600,
                          env=run_env(**extra_env))


class StoppedRun:
    """A `kedro run` stopped (SIGSTOP) at a point named as in tests/fault_injection.

    Use it as a context manager: a run still stopped when the block ends (a failed assertion)
    is killed, not left behind holding its locks.
    """

    def __init__(self, project: Path, command: list[str], stop_at: str, timeout: float = 300,
                 **extra_env: str) -> None:
        marker = project / f".stopped-{time.monotonic_ns()}"
        self.process = subprocess.Popen(
            command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
            env=run_env(PYTHONPATH=os.pathsep.join(filter(None, [
                str(FAULT_INJECTION), os.environ.get("PYTHONPATH")])),
                RL_TEST_STOP_AT=stop_at, RL_TEST_STOP_MARKER=str(marker), **extra_env))
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                output = self.process.communicate()[0]
                raise AssertionError(f"the run never reached {stop_at}:\n{output[-3000:]}")
            time.sleep(0.05)
        self.point = marker.read_text().strip()  # "<pid> <event> <path>"
        marker.unlink()

    def __enter__(self) -> StoppedRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.kill()

    def kill(self) -> str:
        """SIGKILL the run (its whole process group); its output."""
        os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.communicate(timeout=60)[0]

    def resume(self) -> subprocess.CompletedProcess:
        """Let the run go on to its end."""
        os.killpg(self.process.pid, signal.SIGCONT)
        output = self.process.communicate(timeout=600)[0]
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, output)


def project_catalog(project: Path, env: str = "cpu", **runtime_params: str) -> DataCatalog:
    """The project's Data Catalog as a run in ``project`` would build it (paths relative to
    the project: load from it with the working directory there)."""
    from rl_pipeline import settings

    loader = OmegaConfigLoader(str(project / "conf"), env=env,
                               runtime_params=runtime_params, **settings.CONFIG_LOADER_ARGS)
    return DataCatalog.from_config(loader["catalog"])


def mlflow_runs(project: Path) -> tuple:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    experiment = client.get_experiment_by_name("rl_pipeline")
    return client, client.search_runs([experiment.experiment_id], order_by=["start_time ASC"])


def run_tags(runs: list, name: str) -> dict[str, str]:
    (run,) = [r for r in runs if r.info.run_name == name]
    return run.data.tags


def readme_block(containing: str) -> str:
    """The README's fenced code block that contains ``containing``, as a user copies it."""
    blocks = (PROJECT_ROOT / "README.md").read_text().split("```")[1::2]
    (block,) = [b for b in blocks if containing in b]
    return block.split("\n", 1)[1]  # without the language tag
