"""The judge the project serves itself (``reward.judge.model``): an OpenAI-compatible server
on the loopback address for the length of one stage's scoring.

On a GPU with vLLM, ``vllm serve`` (batched, the server verl's own rollout uses); elsewhere
``transformers serve``, which serves any transformers model on a CPU with no build step and
no second copy of the weights' format (llama.cpp's server would need a GGUF and a compiled
binary; the project resolves every model to a transformers folder already). The model is
resolved as ``base_model`` is (a folder, a .gguf file or a hub id), the server started on a
free port, and the stage waits for its health check; :data:`~rl_pipeline.rewards.judge.
URL_ENV` and ``MODEL_ENV`` then tell every scorer in this process (and verl's Ray workers,
through their runtime_env) where it is. It is stopped when the stage's scoring ends, also on
an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rl_pipeline.errors import UserError
from rl_pipeline.rewards.judge import MODEL_ENV, URL_ENV
from rl_pipeline.runs.environment import environ

if TYPE_CHECKING:
    from rl_pipeline.params.reward import JudgeParams, RewardParams

logger = logging.getLogger(__name__)
LOG_TAIL = 3000  # characters of the server's log quoted when it fails to start


class JudgeServerError(UserError, RuntimeError):
    """The judge's server did not start; the message quotes its log."""


def server_kind(params: JudgeParams) -> str:
    """``vllm`` or ``transformers``: ``reward.judge.server``, with auto deciding by whether
    CUDA and vLLM are here."""
    if params.server != "auto":
        return params.server
    import importlib.util

    import torch

    has_vllm = importlib.util.find_spec("vllm") is not None
    return "vllm" if torch.cuda.is_available() and has_vllm else "transformers"


def server_command(params: JudgeParams, folder: Path, port: int) -> list[str]:
    """The command line that serves ``folder`` on ``127.0.0.1:port``."""
    bin_dir = Path(sys.executable).parent
    if server_kind(params) == "vllm":
        exe = shutil.which("vllm", path=str(bin_dir)) or "vllm"
        return [exe, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", str(folder), *params.server_args]
    exe = shutil.which("transformers", path=str(bin_dir)) or "transformers"
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [exe, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
            "--device", device, "--log-level", "warning", *params.server_args]


@contextlib.contextmanager
def judge_served(reward: RewardParams) -> Iterator[str | None]:
    """Serve ``reward.judge.model`` while the block runs, when the reward asks a judge the
    project serves; otherwise do nothing (a judge at ``reward.judge.url``, one already
    served by an enclosing block, or no judge).

    Yields:
        The judge's base URL, or None when no judge is needed.

    Raises:
        JudgeServerError: The server exited, or did not answer its health check within
            ``reward.judge.startup_timeout_s``; its log is quoted.
    """
    judge = reward.judge
    if not reward.uses_judge or judge.url:
        yield judge.url if reward.uses_judge else None
        return
    if os.environ.get(URL_ENV):
        yield os.environ[URL_ENV]
        return
    from rl_pipeline.models.resolve import RESOLVED_DIR, resolve_model

    folder = resolve_model(judge.model, RESOLVED_DIR).path.resolve()
    port = _free_port()
    command = server_command(judge, folder, port)
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryDirectory(prefix="rl_pipeline-judge-") as scratch:
        log_path = Path(scratch) / "server.log"
        with log_path.open("wb") as log:
            env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
            started = time.monotonic()
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env,
                                       start_new_session=True)
            try:
                _wait_healthy(process, f"http://127.0.0.1:{port}/health",
                              judge.startup_timeout_s, log_path, command)
                logger.info("Judge: %s up at %s in %.1f s (%s)", judge.model, url,
                            time.monotonic() - started, " ".join(command[:2]))
                with environ(**{URL_ENV: url, MODEL_ENV: str(folder)}):
                    yield url
            finally:
                _stop(process)


def _wait_healthy(process: subprocess.Popen, health: str, timeout_s: float, log: Path,
                  command: list[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise JudgeServerError(f"the judge's server exited with code {process.returncode} "
                                   f"before it answered: {' '.join(command)}\n"
                                   f"{_tail(log)}")
        try:
            with urllib.request.urlopen(health, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise JudgeServerError(f"the judge's server did not answer {health} within "
                           f"reward.judge.startup_timeout_s={timeout_s:g} s: "
                           f"{' '.join(command)}\n{_tail(log)}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _tail(log: Path) -> str:
    text = log.read_text(encoding="utf-8", errors="replace")
    return text[-LOG_TAIL:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
