"""Write or check requirements/gpu.lock: the GPU dependency set, locked for the GPU machines.

The lock is pyproject.toml's dependencies plus the ``gpu`` extra (``verl[vllm]``), without
the project itself, resolved by ``uv pip compile`` for CPython 3.12 on Linux x86_64
(manylinux_2_28). uv reads package metadata only: no wheel is downloaded or installed, so
this runs on a CPU machine (and in CI) without fetching torch's or vLLM's CUDA wheels.

    python scripts/gpu_lock.py             # rewrite the lock (keeps the pins that still fit)
    python scripts/gpu_lock.py --upgrade   # rewrite it from scratch: newest versions that fit
    python scripts/gpu_lock.py --check     # exit 1 if the lock no longer matches pyproject.toml

uv uses the index pip is configured to use (``pip config list``: index-url, and remote
extra-index-urls); machine-local indexes (file://, folders) are left out, so the lock depends
on pyproject.toml and the public index only, not on what lies on this machine's disk.

The lock carries no hashes: pip treats hashes in a constraints file as hash-checking mode for
every requirement, and the GPU install uses the lock as constraints (``pip install -c``).
``scripts/wheelhouse.py`` records a sha256 for every wheel it ships instead.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON_VERSION = "3.12"
PYTHON_PLATFORM = "x86_64-manylinux_2_28"
EXTRA = "gpu"
# What the GPU stack must be: verl[vllm]'s pins and ours (docs/gpu.md).
REQUIRED_PINS = {
    "torch": "2.11.0",
    "vllm": "0.24.0",
    "transformers": "5.9.0",
    "verl": "0.9.1",
    "trl": "1.12.0",
}
REQUIRED_PACKAGES = ("ray", "mlflow")
PROJECT_NAME = "rl-pipeline"

UV_ARGS = [
    "pip", "compile", "pyproject.toml",
    "--extra", EXTRA,
    "--python-version", PYTHON_VERSION,
    "--python-platform", PYTHON_PLATFORM,
    "--no-header",
]
COMMAND_FOR_HEADER = "uv " + " ".join(UV_ARGS) + " --output-file requirements/gpu.lock"

HEADER = f"""\
# The GPU dependency set of rl_pipeline, locked: pyproject.toml's dependencies plus the extra
# `{EXTRA}` (verl[vllm]), without the project itself, for CPython {PYTHON_VERSION} on Linux x86_64.
# Resolved from package metadata only (no wheel is downloaded) by `make lock`, that is
#     python scripts/gpu_lock.py
# which runs, in the project folder,
#     {COMMAND_FOR_HEADER}
# with the index pip is configured to use. `make lock-check` (python scripts/gpu_lock.py --check)
# fails when this file no longer matches pyproject.toml. Do not edit by hand.
"""


def normalize(name: str) -> str:
    """PEP 503 name normalisation: `Huggingface_Hub` and `huggingface-hub` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, str]:
    """The `name==version` pins of a requirements file (comments and hashes ignored)."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if not m:
            raise ValueError(f"not a pinned requirement: {raw!r}")
        pins[normalize(m.group(1))] = m.group(3)
    return pins


def find_uv() -> str | None:
    try:
        from uv import find_uv_bin  # the `uv` package of the dev extra
    except ImportError:
        pass
    else:
        try:
            return find_uv_bin()
        except FileNotFoundError:
            pass
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return str(beside)
    return shutil.which("uv")


def _is_local(url: str) -> bool:
    return url.startswith("file:") or not re.match(r"^[a-z][a-z0-9+.-]*://", url)


def pip_index_options() -> tuple[list[str], dict[str, str], list[str]]:
    """uv options and environment that reproduce pip's configured index (not its host names).

    Returns (uv arguments, extra environment, notes). Precedence as in pip: the environment
    (PIP_*) over the `download`/`install` sections over `global`.
    """
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, check=False,
    ).stdout
    rank = {"global": 0, "install": 1, "download": 2, ":env:": 3}
    best: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        m = re.match(r"^([^.]+|:env:)\.([a-z-]+)='(.*)'$", line.strip())
        if not m or m.group(1) not in rank:
            continue
        section, key, value = m.groups()
        if key not in best or rank[section] >= best[key][0]:
            best[key] = (rank[section], value)
    conf = {key: value for key, (_, value) in best.items()}
    args: list[str] = []
    env: dict[str, str] = {}
    notes: list[str] = []
    index_url = conf.get("index-url")
    if index_url:
        if _is_local(index_url):
            notes.append(f"pip's index-url {index_url} is machine-local: not passed to uv")
        else:
            args += ["--default-index", index_url]
    extras = conf.get("extra-index-url", "").split()
    remote = [u for u in extras if not _is_local(u)]
    skipped = [u for u in extras if _is_local(u)]
    for url in remote:
        args += ["--index", url]
    if remote:
        # uv would take a package from the first index that has it; pip takes the best
        # version across all of them. Resolve as pip does.
        args += ["--index-strategy", "unsafe-best-match"]
    if skipped:
        notes.append(
            "left out pip's machine-local extra indexes (the lock must not depend on this "
            "machine's disk): " + " ".join(skipped)
        )
    cert = conf.get("cert")
    if cert and "SSL_CERT_FILE" not in os.environ and Path(cert).is_file():
        env["SSL_CERT_FILE"] = cert
    return args, env, notes


def resolve(project: Path, output: Path, *, upgrade: bool = False, quiet: bool = False) -> None:
    """Run uv pip compile for `project` into `output` (an existing `output` gives preferences).

    Raises SystemExit with uv's explanation when the requirements cannot be resolved.
    """
    uv = find_uv()
    if uv is None:
        raise SystemExit(
            "uv is not installed: `pip install -e '.[dev]'` brings it (the dev extra pins it)"
        )
    index_args, index_env, notes = pip_index_options()
    if not quiet:
        for note in notes:
            print(f"gpu_lock: {note}", file=sys.stderr)
    cmd = [uv, *UV_ARGS, "--python", sys.executable, *index_args, "--quiet",
           "--output-file", str(output)]
    if upgrade:
        cmd.append("--upgrade")
    proc = subprocess.run(
        cmd, cwd=project, capture_output=True, text=True,
        env={**os.environ, **index_env},
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"gpu_lock: uv could not resolve {project / 'pyproject.toml'} with extra "
            f"`{EXTRA}` for Python {PYTHON_VERSION} / {PYTHON_PLATFORM}:\n"
            f"{proc.stderr.strip()}"
        )


def problems_in(pins: dict[str, str], what: str) -> list[str]:
    """What the lock must hold: the GPU stack's pins, ray and mlflow, not the project itself."""
    found = []
    for name, version in REQUIRED_PINS.items():
        got = pins.get(name)
        if got != version:
            found.append(f"{what} pins {name}=={got} instead of {name}=={version}"
                         if got else f"{what} has no {name} (needs {name}=={version})")
    for name in REQUIRED_PACKAGES:
        if name not in pins:
            found.append(f"{what} has no {name}")
    if PROJECT_NAME in pins:
        found.append(f"{what} holds the project itself ({PROJECT_NAME})")
    local = [f"{n}=={v}" for n, v in pins.items() if "+" in v]
    if local:
        found.append(f"{what} holds local builds: {', '.join(local)}")
    return found


def assert_portable(text: str, what: str) -> None:
    """No machine-local path may end up in the lock."""
    for line in text.splitlines():
        if re.search(r"file:|(^|[\s(])/[A-Za-z]", line):
            raise SystemExit(f"gpu_lock: {what} holds a machine-local path: {line!r}")


def pin_diff(old: dict[str, str], new: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None:
            lines.append(f"  + {name}=={b}   (new)")
        elif b is None:
            lines.append(f"  - {name}=={a}   (no longer needed)")
        else:
            lines.append(f"  ~ {name}: {a} -> {b}")
    return lines


def write(project: Path, lock: Path, upgrade: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gpu.lock"
        if lock.exists() and not upgrade:
            shutil.copyfile(lock, out)  # uv keeps the pins of an existing output that still fit
        resolve(project, out, upgrade=upgrade)
        body = out.read_text()
    assert_portable(body, "the resolution")
    pins = parse_lock(body)
    problems = problems_in(pins, "the resolution")
    old = parse_lock(lock.read_text()) if lock.exists() else {}
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(HEADER + body)
    changes = pin_diff(old, pins)
    print(f"gpu_lock: wrote {lock} ({len(pins)} packages; {len(changes)} pins changed)")
    if old:  # a first lock lists nothing: every pin is new
        for line in changes:
            print(line)
    if problems:
        print("gpu_lock: but the lock is not the GPU stack we need:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    return 0


def check(project: Path, lock: Path) -> int:
    if not lock.exists():
        print(f"gpu_lock: {lock} does not exist: run `make lock`", file=sys.stderr)
        return 1
    text = lock.read_text()
    locked = parse_lock(text)
    problems = problems_in(locked, str(lock))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gpu.lock"
        shutil.copyfile(lock, out)  # the locked pins are uv's preferences
        resolve(project, out)
        fresh_text = out.read_text()
    fresh = parse_lock(fresh_text)
    problems += problems_in(fresh, "the resolution of pyproject.toml")
    changes = pin_diff(locked, fresh)
    body = "".join(line for line in text.splitlines(keepends=True)
                   if line not in HEADER.splitlines(keepends=True))
    if changes:
        problems.append(f"{lock} no longer matches {project / 'pyproject.toml'} "
                        f"({len(changes)} pins differ; lock -> fresh resolution):\n"
                        + "\n".join(changes))
    elif body.strip() != fresh_text.strip():
        diff = difflib.unified_diff(body.splitlines(), fresh_text.splitlines(),
                                    str(lock), "fresh resolution", lineterm="", n=1)
        problems.append(f"{lock} has the right pins but differs from uv's output "
                        "(hand edits or annotations):\n" + "\n".join(diff))
    if problems:
        for p in problems:
            print(f"gpu_lock: {p}", file=sys.stderr)
        print("gpu_lock: run `make lock` (python scripts/gpu_lock.py) and commit the lock",
              file=sys.stderr)
        return 1
    print(f"gpu_lock: {lock} matches pyproject.toml ({len(locked)} packages; "
          + ", ".join(f"{n}=={v}" for n, v in REQUIRED_PINS.items()) + ")")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="resolve again into a temporary file and compare; write nothing")
    parser.add_argument("--upgrade", action="store_true",
                        help="ignore the pins of the existing lock (newest versions that fit)")
    parser.add_argument("--project", type=Path, default=REPO,
                        help="folder holding pyproject.toml (default: this repository)")
    parser.add_argument("--lock", type=Path, default=None,
                        help="the lock file (default: PROJECT/requirements/gpu.lock)")
    args = parser.parse_args(argv)
    project = args.project.resolve()
    lock = (args.lock or project / "requirements" / "gpu.lock").resolve()
    start = time.monotonic()
    rc = check(project, lock) if args.check else write(project, lock, args.upgrade)
    print(f"gpu_lock: {time.monotonic() - start:.1f} s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
