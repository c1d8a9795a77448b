"""The ``vllm serve`` arguments verl builds from a composed config, checked by vLLM's parser.

verl's rollout server (``vLLMHttpServer.launch_server`` in verl 0.9.1) turns the rollout
config and ``engine_kwargs.vllm`` into a ``vllm serve`` command line and parses it with
vLLM's own CLI parser, on the GPU node, after Ray and the workers are up; an unknown flag
ends the run there (argparse exits 2). This module runs that same verl method on any machine,
with its last step (starting the engine) replaced by recording the parsed arguments, and
reports every flag vLLM's parser does not know.

It runs in a child process (``python -m rl_pipeline.engines.verl.vllm_args CONFIG.yaml``): vLLM's
import is heavy, sets process-wide state, and on a machine without vLLM comes from a folder
of its own (:func:`parser_path`, made by ``make vllm-parser``) that must not leak into the
Kedro process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

VLLM_VERSION = "0.24.0"  # verl[vllm]==0.9.1's pin
# Where `make vllm-parser` installs vLLM without its CUDA dependencies (outside the clone, so
# that it survives fresh clones, as CI's are).
PARSER_ENV = "RL_PIPELINE_VLLM_PARSER"
_MARKER = "RL_PIPELINE_VLLM_ARGS="


def parser_path() -> Path:
    """The folder holding vLLM for argument checks on machines without vLLM installed."""
    default = Path.home() / ".cache" / "rl_pipeline" / f"vllm-{VLLM_VERSION}-parser"
    return Path(os.environ.get(PARSER_ENV) or default)


def vllm_source() -> str | None:
    """Where vLLM comes from for the check: ``installed``, the parser folder, or None."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return "installed"
    folder = parser_path()
    return str(folder) if (folder / "vllm" / "__init__.py").is_file() else None


@dataclass
class ServerArgs:
    """What verl built and what vLLM's parser made of it."""

    argv: list[str]
    unrecognized: list[str] = field(default_factory=list)
    error: str | None = None
    vllm: str | None = None  # vLLM's version, as imported


def build_server_args(config: DictConfig, timeout: float = 300) -> ServerArgs:
    """Run verl's ``launch_server`` on a composed config in a child process.

    Raises:
        RuntimeError: When vLLM is neither installed nor in :func:`parser_path`, or the
            child fails before verl has built the arguments (its output is included).
    """
    # verl's server reads the rollout and model settings alone (its config and model_config):
    # the same ones are built once, whatever the actor's and the reference's settings.
    resolved = OmegaConf.to_container(config.actor_rollout_ref, resolve=True)
    key = OmegaConf.to_yaml({part: resolved[part] for part in ("rollout", "model")})
    if key not in _BUILT:
        _BUILT[key] = _build_in_child(key, timeout)
    return _BUILT[key]


_BUILT: dict[str, ServerArgs] = {}


def _build_in_child(actor_rollout_ref_yaml: str, timeout: float) -> ServerArgs:
    source = vllm_source()
    if source is None:
        raise RuntimeError(f"vLLM is not importable here and {parser_path()} holds no copy "
                           f"of it; run `make vllm-parser` (or set {PARSER_ENV})")
    env = dict(os.environ)
    if source != "installed":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(actor_rollout_ref_yaml)
        result = subprocess.run([sys.executable, "-m", __name__, str(path)], env=env,
                                capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith(_MARKER)), None)
    if line is None:
        raise RuntimeError(f"verl's vLLM server arguments could not be built (exit "
                           f"{result.returncode}):\n{result.stdout[-2000:]}\n"
                           f"{result.stderr[-4000:]}")
    return ServerArgs(**json.loads(line[len(_MARKER):]))


def _build_here(config_path: str) -> ServerArgs:
    """In the child: verl's own method, up to the point where it would start vLLM."""
    import asyncio

    import vllm

    _platform_for_parsing()
    from verl.utils.profiler import build_rollout_dist_profiler
    from verl.workers.rollout.vllm_rollout import vllm_async_server as server_module

    config = OmegaConf.load(config_path)  # actor_rollout_ref's rollout and model
    built: list[list[str]] = []
    build_cli_args = server_module.build_cli_args_from_config

    def recording_build(args: dict) -> list[str]:  # verl's function, its result kept
        out = build_cli_args(args)
        built.append(out)
        return out

    class Recording(server_module.vLLMHttpServer):
        parsed = None

        async def run_server(self, args):  # where verl would start the engine
            self.parsed = args

    # verl's __init__ needs a Ray actor context (job id, node address, free ports); what
    # launch_server reads of it is set here, the configs through verl's own methods.
    server = Recording.__new__(Recording)
    server.config = server._init_config(config.rollout)
    server.model_config = server._init_model_config(config.model)
    server._validate_configs()
    server.replica_rank, server.node_rank, server.nnodes = 0, 0, 1
    server.gpus_per_node = server.config.tensor_model_parallel_size
    server._disaggregation_role = "null"
    server._master_address, server._master_port, server._dp_rpc_port = "127.0.0.1", 0, 0
    server.profiler_controller = build_rollout_dist_profiler(0, server.gpus_per_node)
    server_module.build_cli_args_from_config = recording_build
    try:
        asyncio.run(server.launch_server())
    except SystemExit as exc:  # argparse rejected the command line
        argv = ["serve", server.model_config.local_path, *built[-1]] if built else []
        return ServerArgs(argv=argv, unrecognized=_unrecognized(server, argv),
                          error=f"vllm serve's parser exited with status {exc.code}",
                          vllm=vllm.__version__)
    finally:
        server_module.build_cli_args_from_config = build_cli_args
    return ServerArgs(argv=["serve", server.model_config.local_path, *built[-1]],
                      vllm=vllm.__version__)


def _platform_for_parsing() -> None:
    """Give vLLM a platform on a machine where it detects none (no GPU, a CUDA build).

    The parser's flags come from vLLM's config dataclasses, whatever the platform; only some
    defaults differ. vLLM's CUDA platform cannot be imported without libcuda, so a machine
    without a GPU parses as vLLM's CPU platform. On a GPU node vLLM's own detection stands.
    """
    import vllm.platforms as platforms

    if platforms.resolve_current_platform_cls_qualname().endswith("UnspecifiedPlatform"):
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


def _unrecognized(server, argv: list[str]) -> list[str]:
    """Every flag of ``argv`` that vLLM's parser (built as verl builds it) does not know.

    argparse stops at the first error; its "unrecognized arguments" message lists all of
    them, after vLLM's parser has normalised the spelling (``--a_b`` is ``--a-b``).
    """
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Refusal(Exception):
        pass

    def refuse(message: str) -> None:
        raise Refusal(message)

    parser = FlexibleArgumentParser(description=server._get_cli_description())
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    for module in server._get_cli_modules():
        for cmd in module.cmd_init():
            cmd.subparser_init(subparsers).error = refuse
    parser.error = refuse
    try:
        parser.parse_args(args=argv)
    except Refusal as exc:
        text = str(exc)
        if "unrecognized arguments:" in text:
            tail = text.split("unrecognized arguments:", 1)[1].split()
            return [a.split("=", 1)[0] for a in tail if a.startswith("--")]
        return [text]
    return []


if __name__ == "__main__":
    result = _build_here(sys.argv[1])
    sys.stdout.write(_MARKER + json.dumps(result.__dict__) + "\n")
