"""Shared fixtures: a tiny real tokenizer, GSM8K-shaped records, parameter groups."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
GSM8K_TRAIN = PROJECT_ROOT / "data/01_raw/gsm8k/train.jsonl"
GSM8K_TEST = PROJECT_ROOT / "data/01_raw/gsm8k/test.jsonl"
SMOLLM2_GGUF = PROJECT_ROOT / "data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Folders made once per test session (see resolved_cache), for code that takes no fixtures.
_SESSION_FOLDERS: dict[str, Path] = {}
# Modules that start verl's trainer, Ray clusters or a Ray-placed driver. They run as one
# unit, in order, on one pytest-xdist worker (the other takes the rest): two verl runs at
# once thrash 2 cores (in a CI run that tried it, before each worker had a core of its own,
# each of these tests took 1.3-3x its time alone, and the 2-node run outlived its 10
# minutes), and they are the suite's critical path: handed out first.
RAY_MODULES = ["tests/gpu_boundary/test_ray_cluster_run.py", "tests/engines/verl/test_cpu.py",
               "tests/engines/verl/test_collective.py",
               "tests/gpu_boundary/test_verl_driver.py"]
# The longest of the other modules, longest first (seconds of a run with each worker on a
# core of its own, 2026-11-29, a slow day, the suite at 22:58): handed out first, so that the
# two workers finish together (longest-processing-time-first). Re-measure with
# `make test ARGS=--durations=0`.
LONGEST_MODULES = ["tests/test_faults.py",  # 270
                   "tests/test_run.py",  # 268
                   "tests/gpu_boundary/test_vllm_args.py",  # 93
                   "tests/test_scheduling.py",  # 92
                   "tests/engines/verl/test_engine.py",  # 164, about 90 since 00ea7e8
                   "tests/test_user_errors.py",  # 59
                   "tests/engines/verl/test_cluster.py",  # 55
                   "tests/test_gpu_first_light.py",  # 51
                   "tests/test_gpu_kit.py",  # 50
                   "tests/test_first_session.py",  # 45
                   "tests/test_prune.py",  # 44
                   "tests/engines/verl/test_host.py",  # 40
                   "tests/test_hardware_configs.py"]  # 39


@pytest.fixture(autouse=True)
def _one_environ():
    """Put ``os.environ`` back where a library swapped it: datasets' ``map(num_proc=...)``
    (verl's RLHFDataset filter, run by the verl preflight) replaces it with a copy taken
    mid-test (arrow_dataset.py: ``os.environ = prev_env``), so monkeypatch would restore the
    old object and a test's PATH or variables would leak into the next tests."""
    environ = os.environ
    python_path = os.environ.get("PYTHONPATH")
    yield
    if os.environ is not environ:
        os.environ = environ  # noqa: B003 (the object itself goes back, not its contents)
    # Kedro's bootstrap_project (a kedro command run in-process: tests/test_docs_commands.py)
    # puts the project's src/ on PYTHONPATH for good; a later test's subprocess that should
    # see only its own environment (a wheelhouse's target, the GPU kit's box) would see it.
    if python_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = python_path


# The two tiers: `make test` runs every test (CI); `make test-fast`, the edit loop (under 3
# minutes on 2 cores), leaves out the tests marked slow or gpu_boundary. Slow means more than
# about 5 s on this 2-core machine: a whole kedro run, a Ray cluster, training or generating
# with a model, verl's checks of a whole configuration (plan_verl), a package install.
# Mark one where it is written: `@pytest.mark.slow` on the test, or `pytestmark =
# pytest.mark.slow` for a whole module, with a comment saying why. Two checks keep the tiers
# right as tests are added: a test not marked slow that starts a process through
# tests/projects.py (a whole kedro run) fails, naming the mark (_TierGuard); and the summary
# lists the tests that took more than SLOW_REPORT_SECONDS without the mark.
SLOW_REPORT_SECONDS = 10.0


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker on cores of its own, and so every process it starts (kedro runs, a
    Ray cluster, verl's actors): torch sizes its thread pool from this mask. Two workers'
    torch pools spread over the same 2 cores oversubscribe them, and torch's threads spin
    while they wait for each other: the default CPU run took 72 s alone and 252 s beside the
    2-node verl run."""
    worker = getattr(config, "workerinput", None)
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    count, index = int(worker["workercount"]), int(worker["workerid"].removeprefix("gw"))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[index::count])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each module whole on one worker (its module fixtures, a Ray cluster included, set up
    once), the RAY_MODULES as one unit; units handed out in collection order (pyproject's
    addopts: ``--dist loadscope --no-loadscope-reorder``).

    Written here because ``--dist loadgroup`` does not group under pytest 9 (xdist names an
    item's group by rewriting ``item._nodeid``, which pytest 9 no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return "ray" if module in RAY_MODULES else module

    return ModuleScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The RAY_MODULES first, then the LONGEST_MODULES, then the rest in collection order;
    a module's tests together (pytest reorders items around a parametrized fixture, and a
    unit is handed out where its first test stands)."""
    modules = list(dict.fromkeys(_module(item.nodeid) for item in items))
    first = RAY_MODULES + LONGEST_MODULES
    rank = {m: i for i, m in enumerate(first + [m for m in modules if m not in first])}
    items.sort(key=lambda item: rank[_module(item.nodeid)])
    _guard_projects()


_RUNNING: dict[str, pytest.Item] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _RUNNING["item"] = item  # before its fixtures, module-scoped ones included, are set up


class _TierGuard:
    """tests/projects.py's ``subprocess``: a process it starts (a kedro run, a script) from a
    test that is not marked slow fails that test, naming the mark."""

    def __getattr__(self, name: str) -> Any:
        import subprocess

        value = getattr(subprocess, name)
        if name in ("run", "Popen"):
            item = _RUNNING.get("item")
            if item is not None and item.get_closest_marker("slow") is None:
                pytest.fail(f"{item.nodeid} starts a process through tests/projects.py (a "
                            "whole kedro run): mark it @pytest.mark.slow (tests/conftest.py "
                            "says where), so that `make test-fast` leaves it out",
                            pytrace=False)
        return value


def _guard_projects() -> None:
    projects = sys.modules.get("tests.projects")  # imported by the test modules that use it
    if projects is not None and not isinstance(getattr(projects, "subprocess", None),
                                               _TierGuard):
        projects.subprocess = _TierGuard()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Tests that took over SLOW_REPORT_SECONDS (set-up included) without the slow mark: the
    tiers need a look."""
    seconds: dict[str, float] = {}
    for report in (r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])
                   if getattr(r, "when", None) in ("setup", "call")):
        if "slow" not in report.keywords:
            seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    over = sorted((t, n) for n, t in seconds.items() if t > SLOW_REPORT_SECONDS)
    if over:
        terminalreporter.section("test tiers")
        for t, nodeid in reversed(over):
            terminalreporter.line(f"{t:6.1f}s {nodeid}: not marked slow (tests/conftest.py)")


def read_gsm8k(path: Path = GSM8K_TRAIN, n: int | None = None) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()[:n] if n else f.readlines()
    return [json.loads(line) for line in lines]


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def load_script(name: str) -> Any:
    """A module of scripts/ (not a package), imported by path; scripts/ goes on sys.path so
    that the scripts' own imports of each other resolve."""
    import importlib.util
    import sys

    folder = PROJECT_ROOT / "scripts"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer (vocab 400) with a ChatML template, saved as a model folder.

    The small vocabulary makes GSM8K prompts a few hundred tokens long, so length limits
    bite at realistic values.
    """
    from rl_pipeline.testing import build_bpe_tokenizer

    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    texts = [r["question"] + "\n" + r["answer"] for r in read_gsm8k(n=2000)]
    build_bpe_tokenizer(texts, vocab_size=400, folder=folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from rl_pipeline.models.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)


def base_parameters() -> dict[str, Any]:
    """conf/base's parameters as Kedro loads them (every group; most hold departures only)."""
    from kedro.config import OmegaConfigLoader

    return OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base",
                             default_run_env="base")["parameters"]


@pytest.fixture
def prep_params() -> dict[str, Any]:
    """The GSM8K data_prep group as conf/base gives it (raw: Kedro validates it into
    ``DataPrepParams`` in a session)."""
    return dict(base_parameters()["data_prep"])


@pytest.fixture
def data_params() -> dict[str, Any]:
    """The shared data group as conf/base gives it (raw), responses capped at 8 tokens so
    that tests generate little."""
    return {**base_parameters()["data"], "data_max_response_length": 8}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """A tiny random Qwen2 model with the tiny tokenizer, as a Hugging Face folder."""
    from rl_pipeline.testing import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_model"), tokenizer)


@pytest.fixture(scope="session", autouse=True)
def resolved_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The resolved-model cache of this test session, in pytest's temporary folder (never the
    project's data/): SmolLM2's GGUF conversion (half a minute) happens once per session, for
    the fixtures and for the kedro runs of tests/projects.py alike."""
    folder = tmp_path_factory.mktemp("resolved")
    _SESSION_FOLDERS["resolved"] = folder
    return folder


def resolved_cache_dir() -> Path:
    """:func:`resolved_cache`'s folder, for code that is no fixture."""
    return _SESSION_FOLDERS["resolved"]


@pytest.fixture(scope="session")
def smollm2_dir(resolved_cache: Path) -> Path:
    """SmolLM2-135M-Instruct resolved from its GGUF into a Hugging Face folder (once)."""
    from rl_pipeline.models.resolve import resolve_model

    assert SMOLLM2_GGUF.exists(), "run `make model` to fetch SmolLM2-135M-Instruct"
    return resolve_model(SMOLLM2_GGUF, resolved_cache).path


def gsm8k_prompts(n: int, split: str = "train", path: Path = GSM8K_TRAIN):
    """The first ``n`` GSM8K records as prompt rows in verl's schema (what data_prep writes)."""
    import pandas as pd

    from rl_pipeline.data.prompts import to_verl_frame
    from rl_pipeline.params import DataPrepParams

    records = read_gsm8k(path, n=n)
    work = pd.DataFrame({"question": [r["question"] for r in records],
                         "answer": [r["answer"] for r in records],
                         "ground_truth": [r["answer"].split("#### ")[-1] for r in records]})
    return to_verl_frame(work, DataPrepParams(), split, "images")


# A task a random policy already earns some reward on: the share of digits in the reply.
DIGIT_REWARD = ("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                "    chars = [c for c in solution_str if not c.isspace()]\n"
                "    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0\n")


@pytest.fixture(scope="session")
def digit_reward_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reward file (function ``score``) on which a tiny random model has signal."""
    path = tmp_path_factory.mktemp("reward") / "digits.py"
    path.write_text(DIGIT_REWARD)
    return path


@pytest.fixture
def mlflow_store(tmp_path):
    """A SQLite MLflow tracking and registry store in ``tmp_path``, with an experiment; the
    tracking URI before it is restored afterwards."""
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    mlflow.set_experiment("tests")
    yield tmp_path
    mlflow.set_tracking_uri(before)


def train_catalog(model: Path, folder: Path, train: dict[str, Any],
                  data: dict[str, Any] | None = None, rows: int = 16):
    """An in-memory catalog for the train pipeline: ``rows`` GSM8K train prompts, 4 val
    prompts, the model, and the groups as Kedro would hand them (typed, validated)."""
    from kedro.io import DataCatalog, MemoryDataset

    from rl_pipeline.params import DataParams, EvalParams, RewardParams, resolve_followers
    from rl_pipeline.params.train import TrainParams
    from tests.catalogs import KeptDataset

    train_frame, val_frame = gsm8k_prompts(rows), gsm8k_prompts(4, "test", GSM8K_TEST)
    train_frame.to_parquet(folder / "train.parquet")
    val_frame.to_parquet(folder / "val.parquet")
    catalog = DataCatalog(datasets={
        # read by the run-tags node too: kept for the test to read after the run
        "preflight_report": KeptDataset(), "train_summary": KeptDataset(),
        "train_prompts_file": MemoryDataset(str(folder / "train.parquet")),
        "val_prompts_file": MemoryDataset(str(folder / "val.parquet")),
        "train_prompts": MemoryDataset(train_frame), "val_prompts": MemoryDataset(val_frame),
        "base_model": MemoryDataset(str(model)),
        "train_checkpoints_dir": MemoryDataset(str(folder / "models" / "train_checkpoints")),
        "model_work_dir": MemoryDataset(str(folder / "models")),
    })
    # Kedro instantiates the typed groups in a session; a bare runner is handed them.
    # ... with their followers resolved, as WholeConfigurationHook hands them.
    groups = resolve_followers({"train": TrainParams.model_validate(train),
                                "data": DataParams.model_validate(data or {}),
                                "reward": RewardParams(), "eval": EvalParams()})
    for name, group in groups.items():
        catalog[f"params:{name}"] = group
    return catalog


@pytest.fixture
def old_driver(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that reports a CUDA 12 driver (R535), as such a box's does
    (the driver checks of rl_pipeline.engines.verl.host read it)."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\n"
                   'case "$*" in *driver_version*) echo 535.183.01; echo 535.183.01;; '
                   "*) echo 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)';; esac\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    return "535.183.01"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir):
    """What the catalog hands verl, for the tiny model: prompt files, the model, a checkpoint
    folder and a SQLite tracking store (rl_pipeline.engines.verl.config.LaunchInputs)."""
    from rl_pipeline.engines.verl.config import LaunchInputs
    from tests.verl_inputs import verl_prompts

    root = tmp_path_factory.mktemp("verl_inputs")
    return LaunchInputs(train_files=verl_prompts(root / "train.parquet", 16, "train"),
                        val_files=verl_prompts(root / "val.parquet", 6, "test"),
                        model_path=str(tiny_model_dir),
                        checkpoints_dir=str(root / "checkpoints"),
                        tracking_uri=f"sqlite:///{root}/mlflow.db")
