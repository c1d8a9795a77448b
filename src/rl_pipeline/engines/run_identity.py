"""A training run's identity: what determines the trained weights, as one fingerprint.

Checkpoints live in a folder per identity under ``train_checkpoints``. A rerun with the same
identity resumes its own checkpoints (or finds the run complete and trains no further); a
run whose base model, prompts, engine parameters, data settings or reward differ gets a
folder of its own and never reads another identity's checkpoints. Without this, a rerun
after changing the learning rate resumed the old run's optimizer and schedule, and a nightly
run on new data published yesterday's model under today's lineage.

Each identity folder holds :data:`IDENTITY_FILE`: the fingerprint, what went into it, and the
MLflow runs that trained there (for lineage: which run a resume continues). A run holds its
identity's lock (:func:`training_in`) while it trains: a second run of the same identity is
refused rather than writing the same checkpoints, and the cleanup of old identities never
deletes one a run is training in (a long scheduled run beside newer runs by hand was).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_pipeline.engines.base import TrainSetup
from rl_pipeline.errors import UserError
from rl_pipeline.models.identity import files_sha256, model_identity
from rl_pipeline.params import ConfigError
from rl_pipeline.runs.jsonfile import read_object, write_object

logger = logging.getLogger(__name__)

IDENTITY_FILE = "run_identity.json"
SHORT = 12  # hex digits of the fingerprint in folder names and tags


@dataclass(frozen=True)
class RunIdentity:
    """The fingerprint of a training run and the values it was taken over."""

    fingerprint: str
    inputs: dict[str, Any]

    @property
    def short(self) -> str:
        return self.fingerprint[:SHORT]


@dataclass(frozen=True)
class CheckpointRoot:
    """``train_checkpoints``: the folder holding one folder per run identity, and how many
    identities to keep (the catalog's ``keep_identities``)."""

    path: str
    keep_identities: int = 3

    def folder(self, identity: RunIdentity) -> Path:
        return Path(self.path) / identity.short


def run_identity(setup: TrainSetup, engine: str) -> RunIdentity:
    """The identity of training ``engine`` on ``setup``.

    It covers the base model (its weights' digest, recorded when it was resolved, and its
    tokenizer files), the training prompts' content (not their version: a data_prep rerun
    that writes the same rows continues the same run), the engine, every parameter of the
    engine's group (the seed included; a DeepSpeed config file's content too, whose ZeRO
    stage, optimizer and scheduler shape the run), the ``data`` group and the ``reward`` group
    with its file's content. The validation prompts are left out: they do not change the
    weights.
    """
    reward = setup.reward.model_dump(mode="json")
    if path := setup.reward.custom_reward_function.path:
        reward["file_sha256"] = _reward_file_sha256("reward.custom_reward_function.path", path)
    terms = {f"{i}": _reward_file_sha256(f"reward.terms[{i}].path", term.path)
             for i, term in enumerate(setup.reward.terms) if term.path}
    if terms:  # only then: the identities of runs without term files stay as they were
        reward["terms_file_sha256"] = terms
    group = _group(setup.train, engine)
    deepspeed = (group or {}).get("deepspeed_config")
    if deepspeed and Path(deepspeed).is_file():  # only then: other identities stay as they were
        group["deepspeed_config_sha256"] = _file_sha256(Path(deepspeed))
    inputs = {"engine": engine, "base_model": model_identity(Path(setup.base_model)),
              "train_prompts_sha256": _file_sha256(Path(setup.train_prompts_file)),
              f"train.{engine}": group,
              "data": setup.data.model_dump(mode="json"), "reward": reward}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return RunIdentity(digest, inputs)


def _group(train: Any, engine: str) -> Any:
    if engine not in type(train).model_fields:  # a registered engine may have no group
        return None
    return getattr(train, engine).model_dump(mode="json")


def claim(folder: Path, identity: RunIdentity, mlflow_run_id: str | None) -> dict[str, Any]:
    """Record that a run of ``identity`` trains in ``folder``; what was recorded before.

    Returns:
        The identity file as it was (empty for a new folder): its ``runs`` name the earlier
        MLflow runs that trained here.

    Raises:
        RuntimeError: If the folder holds another identity's checkpoints.
    """
    folder.mkdir(parents=True, exist_ok=True)
    before = read_object(folder / IDENTITY_FILE)
    if before and before.get("fingerprint") != identity.fingerprint:
        raise RuntimeError(f"{folder} holds the checkpoints of run identity "
                           f"{before.get('fingerprint')}, not {identity.fingerprint}")
    runs = [*before.get("runs", []), {"mlflow_run_id": mlflow_run_id, "started": time.time()}]
    write_object(folder / IDENTITY_FILE, {"fingerprint": identity.fingerprint,
                                         "inputs": identity.inputs, "runs": runs})
    return before


class IdentityBusyError(UserError, RuntimeError):
    """Another run is training the same run identity now."""


def _lock_file(folder: Path) -> Path:
    # Beside the folder, hidden (no identity file: never taken for an identity folder), so
    # that train.resume=never can empty the folder while holding it.
    return folder.parent / f".{folder.name}.lock"


def _try_lock(folder: Path) -> int | None:
    """The descriptor of ``folder``'s identity lock, taken; None when a run holds it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_file(folder), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def training_in(folder: Path) -> Iterator[None]:
    """Hold the lock of the identity whose checkpoints are in ``folder`` while a run trains
    there (a ``flock``: it goes with the process, even killed).

    Raises:
        IdentityBusyError: Another run holds it.
    """
    fd = _try_lock(folder)
    if fd is None:
        raise IdentityBusyError(
            f"another run is training run identity {folder.name} now, in {folder}: the same "
            "inputs and parameters. Wait for it (a rerun then resumes or finds it complete), "
            "or change what this run trains")
    try:
        yield
    finally:
        os.close(fd)


def what_changed(folder: Path, identity: RunIdentity, shown: int = 6) -> str | None:
    """For a run identity new to ``folder``'s root: the identity trained there last and
    what differs from it, said as the inputs name it ("train.verl.total_training_steps 10 ->
    12"); None when there is none. A changed parameter trains afresh from step 0 (a run of
    the earlier identity, interrupted, is not continued), and verl's "Training from scratch"
    alone did not say why."""
    others = [p for p in folder.parent.iterdir() if p != folder
              and (p / IDENTITY_FILE).is_file()] if folder.parent.is_dir() else []
    if not others:
        return None
    last = max(others, key=lambda p: (p / IDENTITY_FILE).stat().st_mtime)
    earlier = read_object(last / IDENTITY_FILE)
    before, now = _flat(earlier.get("inputs", {})), _flat(identity.inputs)
    changed = [f"{key} {_shown(before, key)} -> {_shown(now, key)}"
               for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]
    more = f" and {len(changed) - shown} more" if len(changed) > shown else ""
    return (f"run identity {identity.short} is new: it trains from step 0. The identity "
            f"trained last here, {last.name} (MLflow run {previous_run_id(earlier)}), "
            f"differs in: {'; '.join(changed[:shown]) or 'nothing recorded'}{more}. To continue "
            "that run instead, rerun with its settings, or set train.resume to one of its "
            f"checkpoints in {last}")


def _shown(inputs: dict[str, Any], key: str) -> str:
    return repr(inputs[key]) if key in inputs else "(unset)"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        flat.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def previous_run_id(before: dict[str, Any]) -> str | None:
    """The MLflow run that last trained in an identity folder, from its identity file."""
    return next((r["mlflow_run_id"] for r in reversed(before.get("runs", []))
                 if r.get("mlflow_run_id")), None)


def prune(root: CheckpointRoot, current: Path) -> list[Path]:
    """Delete the identity folders beyond the ``keep_identities`` most recently used (the
    current one always kept); what was deleted."""
    folders = [p for p in Path(root.path).iterdir() if (p / IDENTITY_FILE).is_file()] \
        if Path(root.path).is_dir() else []
    folders.sort(key=lambda p: (p / IDENTITY_FILE).stat().st_mtime, reverse=True)
    kept = {current.resolve()}
    for folder in folders:
        if len(kept) >= root.keep_identities:
            break
        kept.add(folder.resolve())
    removed = []
    for folder in (p for p in folders if p.resolve() not in kept):
        fd = _try_lock(folder)
        if fd is None:
            logger.info("Keeping the checkpoints of run identity %s: a run is training in it "
                        "now", folder.name)
            continue
        try:
            logger.info("Removing the checkpoints of run identity %s (train_checkpoints keeps "
                        "the last %d)", folder.name, root.keep_identities)
            shutil.rmtree(folder, ignore_errors=True)
            _lock_file(folder).unlink(missing_ok=True)
        finally:
            os.close(fd)
        removed.append(folder)
    return removed


def _reward_file_sha256(parameter: str, path: str) -> str:
    """The digest of a reward's code: its file, or the file of a ``pkg://`` module.

    Raises:
        ConfigError: Naming the parameter, when there is no such file or module.
    """
    import importlib.util

    from rl_pipeline.rewards.scoring import PKG

    if path.startswith(PKG):
        try:
            spec = importlib.util.find_spec(path.removeprefix(PKG))
        except (ImportError, ValueError):  # a parent package that is not there
            spec = None
        file = Path(spec.origin) if spec and spec.origin else None
    else:
        file = Path(path)
    if file is None or not file.is_file():
        raise ConfigError(f"{parameter}={path!r}: no such file (a Python file that defines "
                          f"the reward function, or {PKG}<module> for an importable module)")
    return _file_sha256(file)


def _file_sha256(path: Path) -> str:
    return files_sha256([path])
