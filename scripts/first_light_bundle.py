"""The GPU first-light bundle: everything the lent GPU image lacks for verl + TRL + kedro runs
without vLLM, installed, stripped and xz-packed, to travel in ONE upload beside the repository
(docs/gpu.md, "First light").

    python scripts/first_light_bundle.py --image requirements/images/lent-h100.freeze --out .gpu \
        [--model data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--python-version 3.12] [--cache DIR] [--glibc 2.28] [--xz-threads 0]

What it does:
    1. reads requirements/first-light.txt (package names in two sections, `# [A] ...` for the
       verl path and `# [K] ...` for the kedro path) and takes every version from
       requirements/gpu.lock; leaves out what the image (--image: `name==version` lines, and
       name-only lines for packages present at an unknown version) has at the locked version;
    2. downloads each wheel for CPython 3.12 manylinux x86_64 with --no-deps into --cache
       (default ~/.cache/rl_pipeline/first-light/wheels, reused), building the sdist-only
       antlr4-python3-runtime with `pip wheel --no-deps`;
    3. reports every Requires-Dist of those wheels (no extra, marker true on cp312 Linux) that
       is neither in the bundle, nor in the image, nor in KNOWN_UNNEEDED below;
    4. installs each bundle with `pip install --no-deps --no-compile --target`, strips what a
       run never loads (Ray's Java jars, source maps, bin/, mlflow's web UI, stray top-level
       packages that would shadow the project's own, __pycache__) and packs it with xz -6 to
       OUT/a/siteA.txz and OUT/a/siteK.txz;
    5. splits the model (when --model exists) into parts of at most 47 MiB, one folder per
       upload: OUT/b/<name>.part-aa, OUT/c/<name>.part-ab, ..., each with a .sha256 file;
    6. prints each upload's size with the repository's working tree added (what travels with
       every upload) and fails (exit 1) when one is over the 64 MiB cap (warns above 62 MiB);
       writes OUT/first-light.json.

On the box (Python 3.12, no network), per bundle:
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall('/tmp/site', \
filter='tar')" .gpu/a/siteA.txz
    export PYTHONPATH=$PWD/src:/tmp/site
or, from Python, `unpack(txz, site_dir)` and `join_parts(parts, out)` of this module, which
import nothing outside the standard library at module level.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_LIST = ROOT / "requirements/first-light.txt"
LOCK = ROOT / "requirements/gpu.lock"
DEFAULT_IMAGE = ROOT / "requirements/images/lent-h100.freeze"
DEFAULT_MODEL = ROOT / "data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path.home() / ".cache/rl_pipeline/first-light/wheels"

MiB = 1 << 20
UPLOAD_CAP = 64 * MiB  # one upload, the working tree included
UPLOAD_WARN = 62 * MiB
PART_SIZE = 47 * MiB  # a model part: + the tree (6.6 MiB) stays well under the cap
XZ_PRESET = 6

# The image has these, but too new for verl 0.9.1 (transformers <5.11; the locked
# transformers checks tokenizers<=0.23.0 at import): the lock's versions travel and shadow
# them on PYTHONPATH.
REPLACE_IMAGE: dict[str, str] = {
    "transformers": "verl 0.9.1 needs transformers<5.11; the image has 5.17",
    "tokenizers": "the locked transformers checks tokenizers<=0.23.0 at import",
}
# Published as a source distribution only: built here (into a py3-none-any wheel).
SDIST_ONLY = frozenset({"antlr4-python3-runtime"})
# Top-level packages that verl's and TransferQueue's wheels ship by accident: on PYTHONPATH
# they would shadow the project's own `scripts` and `tests`.
STRAY_TOP_LEVEL = ("scripts", "tests", "recipe", "tutorial", "examples")

# Requires-Dist that stays out on purpose: name -> why (checked against the wheels' code).
KNOWN_UNNEEDED: dict[str, str] = {
    "wandb": "verl's tracker only, imported inside a function; trainer.logger is [console]",
    "gitpython": "kedro's and mlflow's git helpers import it inside functions, in try blocks",
    "cookiecutter": "`kedro new` only",
    "build": "`kedro package` only",
    "docker": "mlflow's `build-docker` and model serving only",
    "graphene": "the mlflow server's GraphQL API only",
    "gunicorn": "the mlflow server only",
    "huey": "the mlflow server's job queue only",
    "flask-cors": "the mlflow server only",
    "skops": "mlflow's sklearn flavour only",
    "scikit-learn": "mlflow's sklearn flavour only",
    "scipy": "mlflow/models/utils.py imports it in a try block (HAS_SCIPY)",
    "python-dotenv": "mlflow's own CLI (mlflow/cli) and uvicorn's --env-file only",
    "pyasn1-modules": "google-auth's pure-Python RSA fallback; cryptography is carried",
    "openai": "the project's judge reward only (rewards/judge.py imports it inside a function)",
}


@dataclass(frozen=True)
class Item:
    """One package to carry."""

    name: str
    version: str
    bundle: str


@dataclass
class Plan:
    """What to carry, and what the image already has."""

    items: list[Item]
    skipped: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)


# --- reading the inputs -------------------------------------------------------------------

def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"


def parse_image(text: str) -> dict[str, str | None]:
    """An image's package list -> {normalised name: version, or None when unknown}.

    Reads `name==version` (pip freeze, `pip list --format=freeze`), `name===version`,
    `name @ URL` (version unknown unless the URL names a wheel) and bare `name` lines (present
    at an unknown version). Comments, blank lines and options (`-e ...`) are ignored."""
    found: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        m = re.fullmatch(rf"({_NAME})\s*(?:(?:===?)\s*(\S+)|@\s*(\S+))?", line)
        if not m:
            raise ValueError(f"image list: cannot read {raw!r}")
        version = m.group(2)
        url = (m.group(3) or "").split("#", 1)[0]
        if url.endswith(".whl"):
            parts = url.rsplit("/", 1)[-1].split("-")
            version = parts[1] if len(parts) >= 5 else None
        found[normalize(m.group(1))] = version
    return found


def parse_lock(text: str) -> dict[str, str]:
    """requirements/gpu.lock -> {normalised name: version}."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        m = re.match(rf"^({_NAME})==(\S+)", raw)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def parse_bundles(text: str) -> dict[str, list[str]]:
    """requirements/first-light.txt -> {"A": [names], "K": [names]}, in file order.

    A comment line `# [X] ...` starts section X; other comments explain the next entry."""
    bundles: dict[str, list[str]] = {}
    current: str | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = re.match(r"#\s*\[(\w+)\]", line)
        if m:
            current = m.group(1)
            bundles.setdefault(current, [])
            continue
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not re.fullmatch(_NAME, line):
            raise ValueError(f"first-light list line {lineno}: a name only, not {raw!r}")
        if current is None:
            raise ValueError(f"first-light list line {lineno}: {line} before any `# [X]` line")
        bundles[current].append(normalize(line))
    return bundles


def same_version(a: str, b: str) -> bool:
    """PEP 440 equality; the image's `2.11.0+cu130` counts as a lock's `2.11.0`."""
    from packaging.version import InvalidVersion, Version

    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return a == b
    if va == vb:
        return True
    return (not va.local or not vb.local) and va.public == vb.public


def make_plan(bundles: dict[str, list[str]], lock: dict[str, str],
              image: dict[str, str | None]) -> Plan:
    """The bundles minus what the image has at the locked version, versions from the lock.

    Kept (carried) although the image has them: a different version (REPLACE_IMAGE's
    transformers and tokenizers above all) or an unknown one. A name in two bundles goes in
    the first. Raises ValueError naming every name the lock does not pin."""
    missing = sorted({n for names in bundles.values() for n in names if n not in lock})
    if missing:
        raise ValueError(f"not pinned in {LOCK.name}: {', '.join(missing)}")
    plan = Plan(items=[])
    seen: set[str] = set()
    for bundle, names in bundles.items():
        for name in names:
            if name in seen:
                plan.kept.append({"name": name, "bundle": bundle,
                                  "reason": "listed in an earlier bundle: carried there"})
                continue
            seen.add(name)
            version = lock[name]
            if name in image:
                have = image[name]
                if have is None:
                    plan.kept.append({"name": name, "bundle": bundle, "reason":
                                      f"the image has it at an unknown version; carrying "
                                      f"{version}"})
                elif same_version(have, version):
                    plan.skipped.append({"name": name, "bundle": bundle, "version": have,
                                         "reason": f"the image has {have}, the locked version"})
                    continue
                else:
                    why = REPLACE_IMAGE.get(name, "the locked version shadows it")
                    plan.kept.append({"name": name, "bundle": bundle, "reason":
                                      f"the image has {have}, the lock pins {version}: {why}"})
            plan.items.append(Item(name, version, bundle))
    return plan


# --- wheels -------------------------------------------------------------------------------

def manylinux_platforms(glibc: str = "2.28", arch: str = "x86_64") -> list[str]:
    """manylinux_2_28_x86_64 and every older manylinux tag (pip matches --platform exactly)."""
    major, minor = (int(x) for x in glibc.split("."))
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags: list[str] = []
    for k in range(minor, 4, -1):
        tags.append(f"manylinux_{major}_{k}_{arch}")
        if major == 2 and k in legacy:
            tags.append(f"{legacy[k]}_{arch}")
    return tags


def _target_args(python_version: str, platforms: Sequence[str]) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    args = ["--python-version", python_version, "--implementation", "cp", "--abi", abi]
    for tag in platforms:
        args += ["--platform", tag]
    return args


def _pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--no-input",
                           "--progress-bar", "off", "--disable-pip-version-check"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def _supported_tags(python_version: str, platforms: Sequence[str]) -> list[Any]:
    from packaging import tags

    pv = tuple(int(x) for x in python_version.split("."))
    interp = "cp" + python_version.replace(".", "")
    return [*tags.cpython_tags(pv, [interp], platforms),
            *tags.compatible_tags(pv, interp, platforms)]


def find_wheel(folder: Path, name: str, version: str, python_version: str,
               platforms: Sequence[str]) -> Path | None:
    """The best wheel of name==version in ``folder`` that the target accepts, if any."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    if not folder.is_dir():
        return None
    rank = {t: i for i, t in enumerate(_supported_tags(python_version, platforms))}
    best: tuple[int, Path] | None = None
    for path in folder.glob("*.whl"):
        try:
            wname, wver, _, wtags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if normalize(str(wname)) != name or not same_version(str(wver), version):
            continue
        score = min((rank[t] for t in wtags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, path)
    return best[1] if best else None


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 6) -> str:
    return "\n    ".join((proc.stderr or proc.stdout).strip().splitlines()[-lines:])


def fetch_wheels(items: Sequence[Item], cache: Path, python_version: str,
                 platforms: Sequence[str]) -> dict[str, Path]:
    """{name: wheel} for every item, from ``cache`` or downloaded (and built) into it."""
    cache.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    todo: list[Item] = []
    for item in items:
        wheel = find_wheel(cache, item.name, item.version, python_version, platforms)
        if wheel:
            found[item.name] = wheel
        else:
            todo.append(item)
    print(f"wheels: {len(found)} in the cache {cache}, {len(todo)} to fetch", flush=True)
    binary = [i for i in todo if i.name not in SDIST_ONLY]
    if binary:
        reqs = [f"{i.name}=={i.version}" for i in binary]
        proc = _pip("download", "--no-deps", "--only-binary=:all:",
                    *_target_args(python_version, platforms), "-d", str(cache), *reqs)
        if proc.returncode != 0:  # which one? one at a time, for the message
            errors = []
            for i in binary:
                one = _pip("download", "--no-deps", "--only-binary=:all:",
                           *_target_args(python_version, platforms), "-d", str(cache),
                           f"{i.name}=={i.version}")
                if one.returncode != 0:
                    errors.append(f"{i.name}=={i.version}:\n    {_tail(one)}")
            raise RuntimeError("pip download failed for\n" + "\n".join(errors or [_tail(proc)]))
    for i in (i for i in todo if i.name in SDIST_ONLY):
        # SOURCE_DATE_EPOCH: the same wheel, byte for byte, on every build
        proc = _pip("wheel", "--no-deps", "--no-binary", i.name, "-w", str(cache),
                    f"{i.name}=={i.version}", env={"SOURCE_DATE_EPOCH": "315532800"})
        if proc.returncode != 0:
            raise RuntimeError(f"building {i.name}=={i.version} failed:\n    {_tail(proc)}")
    for i in todo:
        wheel = find_wheel(cache, i.name, i.version, python_version, platforms)
        if wheel is None:
            raise RuntimeError(f"{i.name}=={i.version}: no wheel for CPython {python_version} "
                               f"on {platforms[0]} in {cache} after fetching it")
        found[i.name] = wheel
    return found


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = [n for n in z.namelist()
                if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(meta) != 1:
            raise ValueError(f"{wheel.name}: expected one .dist-info/METADATA, found {meta}")
        message = email.parser.Parser().parsestr(z.read(meta[0]).decode("utf-8", "replace"))
    return list(message.get_all("Requires-Dist") or [])


def marker_environment(python_version: str, machine: str = "x86_64") -> dict[str, str]:
    """PEP 508 marker values for CPython ``python_version`` on Linux ``machine``."""
    full = python_version if python_version.count(".") == 2 else f"{python_version}.0"
    short = ".".join(full.split(".")[:2])
    return {"implementation_name": "cpython", "implementation_version": full,
            "os_name": "posix", "platform_machine": machine,
            "platform_python_implementation": "CPython", "platform_release": "",
            "platform_system": "Linux", "platform_version": "", "python_full_version": full,
            "python_version": short, "sys_platform": "linux", "extra": ""}


def project_requires(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The project's own ``[project].dependencies``, which the rungs import as much as verl's."""
    import tomllib

    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def requires_report(wheels: dict[str, tuple[str, Path]], carried: dict[str, str],
                    image: dict[str, str | None], python_version: str,
                    project: Sequence[str] = ()) -> dict[str, Any]:
    """Every Requires-Dist (no extra, marker true on the target) of ``wheels``
    ({name: (version, wheel)}) and every requirement in ``project`` (the project's own
    dependencies), sorted by where it is met.

    ``carried``: {name: version} of what the bundles carry; those shadow the image's.
    Returns {"unresolved": [...], "conflicts": [...], "known_unneeded": {...}}; entries name
    the packages that require them."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    env = marker_environment(python_version)
    unresolved: dict[str, dict[str, Any]] = {}
    conflicts: list[dict[str, str]] = []
    unneeded: dict[str, dict[str, Any]] = {}
    owners = [(f"{owner} {version}", wheel_requires(wheel))
              for owner, (version, wheel) in sorted(wheels.items())]
    if project:
        owners.append(("the project (pyproject.toml)", list(project)))
    for by, lines in owners:
        for line in lines:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = normalize(req.name)
            have = carried.get(name)
            where = "bundle"
            if have is None and name in image:
                have, where = image[name], "image"
                if have is None:
                    continue  # present at an unknown version
            if have is not None:
                try:
                    ok = req.specifier.contains(Version(have), prereleases=True)
                except InvalidVersion:
                    ok = True
                if not ok:
                    conflicts.append({"name": name, "have": have, "where": where,
                                      "needs": str(req.specifier), "required_by": by})
                continue
            for table, reason in ((unneeded, KNOWN_UNNEEDED.get(name)), (unresolved, "")):
                if reason is not None:
                    entry = table.setdefault(name, {"reason": reason, "required_by": []})
                    entry["required_by"].append(f"{by} ({req.specifier or 'any'})")
                    break
    return {"unresolved": dict(sorted(unresolved.items())), "conflicts": conflicts,
            "known_unneeded": dict(sorted(unneeded.items()))}


def install(wheels: Iterable[Path], site: Path, python_version: str,
            platforms: Sequence[str]) -> None:
    """``pip install --no-deps --no-compile --target site`` for the target interpreter."""
    proc = _pip("install", "--no-deps", "--no-compile", "--no-index", "--only-binary=:all:",
                "--no-warn-script-location", *_target_args(python_version, platforms),
                "--target", str(site), *(str(w) for w in wheels))
    if proc.returncode != 0:
        raise RuntimeError(f"pip install --target {site} failed:\n    {_tail(proc, 12)}")


# --- stripping, packing, unpacking --------------------------------------------------------

def tree_bytes(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path`` (a file or a folder); links count as themselves."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size, 1
    total = files = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            total += os.lstat(os.path.join(dirpath, n)).st_size
            files += 1
    return total, files


def strip_site(site: Path) -> dict[str, int]:
    """Delete from an installed site what a run never loads; {rule: bytes removed}."""
    removed: dict[str, int] = {}

    def drop(rule: str, path: Path) -> None:
        if not (path.exists() or path.is_symlink()):
            return
        removed[rule] = removed.get(rule, 0) + tree_bytes(path)[0]
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()

    drop("ray/jars (Java workers)", site / "ray/jars")
    dashboard = site / "ray/dashboard"
    if dashboard.is_dir():
        for m in sorted(dashboard.rglob("*.map")):
            drop("ray dashboard *.map (source maps)", m)
    drop("bin/ (console scripts for another interpreter)", site / "bin")
    for name in STRAY_TOP_LEVEL:
        drop(f"top-level {name} (would shadow the project's)", site / name)
        drop(f"top-level {name} (would shadow the project's)", site / f"{name}.py")
    drop("mlflow/server/js/build (web UI)", site / "mlflow/server/js/build")
    for cache in sorted(site.rglob("__pycache__"), key=lambda p: len(p.parts), reverse=True):
        drop("__pycache__", cache)
    return removed


def _owner_reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_tree(tar: tarfile.TarFile, site: Path) -> None:
    for child in sorted(site.iterdir()):
        tar.add(child, arcname=child.name, filter=_owner_reset)  # add() sorts folders


def pack(site: Path, out: Path, preset: int = XZ_PRESET, threads: int = 0,
         use_xz: bool | None = None) -> dict[str, Any]:
    """``site``'s contents as an xz tar at ``out`` (written to a temporary file, then
    renamed); modes kept, owners reset. With `xz` on PATH (or use_xz=True) it compresses,
    with ``threads`` (0: one per core); else Python's lzma.
    {bytes, seconds (wall), cpu_seconds (this process and xz), tool}."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    xz = shutil.which("xz") if use_xz is not False else None
    if use_xz and not xz:
        raise RuntimeError("xz is not on PATH")
    start, cpu = time.perf_counter(), os.times()
    try:
        if xz:
            with open(tmp, "wb") as f:
                proc = subprocess.Popen([xz, f"-{preset}", f"-T{threads}", "-c"],
                                        stdin=subprocess.PIPE, stdout=f)
                assert proc.stdin is not None
                try:
                    with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                        _add_tree(tar, site)
                finally:
                    proc.stdin.close()
                    code = proc.wait()
            if code != 0:
                raise RuntimeError(f"xz exited with {code}")
            tool = f"xz -{preset} -T{threads}"
        else:
            with tarfile.open(tmp, "w:xz", preset=preset) as tar:
                _add_tree(tar, site)
            tool = f"tarfile lzma preset {preset}"
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    end = os.times()
    cpu_seconds = sum(getattr(end, k) - getattr(cpu, k)
                      for k in ("user", "system", "children_user", "children_system"))
    return {"bytes": out.stat().st_size, "seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds": round(cpu_seconds, 1), "tool": tool}


def unpack(txz: str | os.PathLike[str], site_dir: str | os.PathLike[str]) -> Path:
    """Extract a bundle into ``site_dir`` (created), keeping executable bits (raylet and
    gcs_server need them): the box's step before `PYTHONPATH=$PWD/src:<site_dir>`."""
    site = Path(site_dir)
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(txz) as tar:
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(site, filter="tar")
        else:  # Python before 3.11.4 / 3.12.0
            tar.extractall(site)
    return site


# --- the model, in parts ------------------------------------------------------------------

def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _suffix(i: int) -> str:
    if i >= 26 * 26:
        raise ValueError("more than 676 parts")
    return "abcdefghijklmnopqrstuvwxyz"[i // 26] + "abcdefghijklmnopqrstuvwxyz"[i % 26]


def _folder(i: int) -> str:
    """Part i's upload folder: b, c, ... (a holds the bundles)."""
    if i >= 25:
        raise ValueError("more than 25 model parts")
    return "bcdefghijklmnopqrstuvwxyz"[i]


def split_file(path: Path, out: Path, part_size: int = PART_SIZE) -> list[Path]:
    """``path`` in parts of at most ``part_size`` bytes, one upload folder each:
    out/b/<name>.part-aa, out/c/<name>.part-ab, ...; beside each part its own
    `<part>.sha256` and the whole file's `<name>.sha256` (both `sha256sum -c` format).
    Parts of ``path``'s name left by an earlier split go first (and folders they leave
    empty)."""
    name = path.name
    if out.is_dir():
        for folder in out.iterdir():
            if folder.is_dir() and folder.name != "a":
                for old in folder.iterdir():
                    if old.name.startswith(f"{name}.part-") or old.name == f"{name}.sha256":
                        old.unlink()
                if not any(folder.iterdir()):
                    folder.rmdir()
    whole = hashlib.sha256()
    parts: list[Path] = []
    with open(path, "rb") as src:
        while True:
            i = len(parts)
            folder = out / _folder(i)
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / f"{name}.part-{_suffix(i)}"
            tmp = part.with_name(f".{part.name}.tmp")
            h = hashlib.sha256()
            n = 0
            with open(tmp, "wb") as dst:
                while n < part_size:
                    block = src.read(min(1 << 20, part_size - n))
                    if not block:
                        break
                    dst.write(block)
                    h.update(block)
                    whole.update(block)
                    n += len(block)
            if n == 0 and parts:
                tmp.unlink()
                if not any(folder.iterdir()):
                    folder.rmdir()
                break
            os.replace(tmp, part)
            (folder / f"{part.name}.sha256").write_text(f"{h.hexdigest()}  {part.name}\n")
            parts.append(part)
            if n < part_size:
                break
    for part in parts:
        (part.parent / f"{name}.sha256").write_text(f"{whole.hexdigest()}  {name}\n")
    return parts


def _recorded_sha256(path: Path) -> str:
    """The digest in a `sha256sum` line file."""
    if not path.is_file():
        raise ValueError(f"{path.name} is missing: no checksum to check against")
    text = path.read_text().split()
    if not text or not re.fullmatch(r"[0-9a-f]{64}", text[0]):
        raise ValueError(f"{path}: not a sha256sum line")
    return text[0]


def join_parts(parts: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
               whole_sha256: str | None = None) -> Path:
    """Join ``parts`` (`<name>.part-aa`, `-ab`, ..., any order, any folders) into ``out``.

    Checks each part against its `<part>.sha256`, that no part is missing, and the whole
    against ``whole_sha256`` or the `<name>.sha256` beside the parts. On any mismatch it
    raises ValueError naming the part and leaves no ``out``."""
    paths = [Path(p) for p in parts]
    if not paths:
        raise ValueError("no parts given")
    keyed: dict[str, Path] = {}
    names: set[str] = set()
    for p in paths:
        m = re.fullmatch(r"(.+)\.part-([a-z]{2})", p.name)
        if not m:
            raise ValueError(f"{p}: not named <file>.part-XX")
        names.add(m.group(1))
        keyed[m.group(2)] = p
    if len(names) != 1:
        raise ValueError(f"parts of several files: {sorted(names)}")
    name = names.pop()
    order = sorted(keyed)
    expected = [_suffix(i) for i in range(len(order))]
    if order != expected:
        lost = [s for s in [_suffix(i) for i in range(len(order) + 1)] if s not in keyed]
        raise ValueError(f"{name}: part-{lost[0]} is missing (have {', '.join(order)})")
    if whole_sha256 is None:
        recorded = [p.parent / f"{name}.sha256" for p in paths
                    if (p.parent / f"{name}.sha256").is_file()]
        if not recorded:
            raise ValueError(f"{name}.sha256 is missing beside the parts: no checksum for the "
                             f"whole file")
        whole_sha256 = _recorded_sha256(recorded[0])
    target = Path(out)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst:
            for suffix in order:
                part = keyed[suffix]
                want = _recorded_sha256(part.with_name(f"{part.name}.sha256"))
                h = hashlib.sha256()
                with open(part, "rb") as src:
                    for block in iter(lambda s=src: s.read(1 << 20), b""):
                        h.update(block)
                        whole.update(block)
                        dst.write(block)
                if h.hexdigest() != want:
                    raise ValueError(f"{part}: sha256 {h.hexdigest()} is not the recorded "
                                     f"{want}: the part is corrupt or truncated")
        if whole.hexdigest() != whole_sha256:
            raise ValueError(f"{name}: the joined file's sha256 {whole.hexdigest()} is not "
                             f"{whole_sha256}")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def missing_modules(python: str, env: dict[str, str], modules: Sequence[str]) -> list[str]:
    """Those of ``modules`` that ``python`` (with ``env``) cannot find; all of them when the
    interpreter itself fails."""
    probe = ("import importlib.util, json, sys\n"
             "def found(m):\n"
             "    try: return importlib.util.find_spec(m) is not None\n"
             "    except Exception: return False\n"
             "print(json.dumps([m for m in sys.argv[1:] if not found(m)]))")
    result = subprocess.run([python, "-c", probe, *modules], env=env, capture_output=True,
                            text=True, timeout=120)
    return json.loads(result.stdout) if result.returncode == 0 else list(modules)


# --- what each upload carries -------------------------------------------------------------

def repo_tree_bytes(root: Path = ROOT) -> dict[str, int]:
    """The working tree that travels with every upload: tracked files (`git ls-files`) and
    untracked files git does not ignore. {tracked, untracked, total, files}."""
    sizes: dict[str, int] = {}
    files = 0
    for kind, extra in (("tracked", []), ("untracked", ["--others", "--exclude-standard"])):
        out = subprocess.run(["git", "ls-files", "-z", *extra], cwd=root, check=True,
                             capture_output=True).stdout
        total = 0
        for rel in filter(None, out.split(b"\0")):
            p = root / os.fsdecode(rel)
            if p.is_symlink() or p.is_file():
                total += p.lstat().st_size
                files += 1
        sizes[kind] = total
    return {**sizes, "total": sizes["tracked"] + sizes["untracked"], "files": files}


def check_uploads(folders: dict[str, int], tree: int, cap: int = UPLOAD_CAP,
                  warn: int = UPLOAD_WARN) -> tuple[list[dict[str, Any]], bool]:
    """Each upload folder's bytes plus the tree against the cap: (rows, all within cap)."""
    rows = []
    for folder, size in folders.items():
        total = size + tree
        status = "FAIL" if total > cap else "WARN" if total > warn else "ok"
        rows.append({"folder": folder, "bytes": size, "with_tree": total, "status": status})
    return rows, all(r["status"] != "FAIL" for r in rows)


def format_table(rows: Sequence[dict[str, Any]], tree: int, cap: int = UPLOAD_CAP) -> str:
    lines = [f"{'upload':<8}{'folder':<14}{'bytes':>14}{'MiB':>9}{'+ tree MiB':>12}  verdict",
             f"{'':<8}{'(tree)':<14}{tree:>14,}{tree / MiB:>9.2f}"]
    for i, r in enumerate(rows, 1):
        lines.append(f"{i:<8}{r['folder']:<14}{r['bytes']:>14,}{r['bytes'] / MiB:>9.2f}"
                     f"{r['with_tree'] / MiB:>12.2f}  {r['status']}")
    lines.append(f"cap {cap / MiB:.0f} MiB per upload, the tree included")
    return "\n".join(lines)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --- the build ----------------------------------------------------------------------------

def build(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    seconds: dict[str, float] = {}
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    lock = parse_lock(LOCK.read_text())
    image = parse_image(args.image.read_text())
    bundles = parse_bundles(args.bundles.read_text())
    plan = make_plan(bundles, lock, image)
    print(f"image {args.image}: {len(image)} packages "
          f"({sum(v is None for v in image.values())} at unknown versions)")
    for s in plan.skipped:
        print(f"  skip  {s['name']} ({s['bundle']}): {s['reason']}")
    for k in plan.kept:
        print(f"  carry {k['name']} ({k['bundle']}): {k['reason']}")

    platforms = manylinux_platforms(args.glibc)
    t = time.perf_counter()
    wheel_paths = fetch_wheels(plan.items, args.cache, args.python_version, platforms)
    seconds["fetch"] = round(time.perf_counter() - t, 1)
    carried = {i.name: i.version for i in plan.items}
    report = requires_report({i.name: (i.version, wheel_paths[i.name]) for i in plan.items},
                             carried, image, args.python_version, project_requires())
    print("Requires-Dist not in the bundles nor in the image list:")
    if report["known_unneeded"]:
        print(f"  known unneeded: {', '.join(report['known_unneeded'])}")
    for c in report["conflicts"]:
        print(f"  CONFLICT {c['name']} {c['needs']} (by {c['required_by']}), the {c['where']} "
              f"has {c['have']}")
    for name, entry in report["unresolved"].items():
        print(f"  UNRESOLVED {name}: required by {'; '.join(entry['required_by'])}")
    if not report["unresolved"] and not report["conflicts"]:
        print("  none unresolved, no conflicts")

    sites: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="first-light-") as tmp:
        for bundle in bundles:
            items = [i for i in plan.items if i.bundle == bundle]
            txz = out / "a" / f"site{bundle}.txz"
            if not items:
                txz.unlink(missing_ok=True)
                continue
            site = Path(tmp) / f"site{bundle}"
            t = time.perf_counter()
            install([wheel_paths[i.name] for i in items], site, args.python_version, platforms)
            seconds[f"install {bundle}"] = round(time.perf_counter() - t, 1)
            installed, installed_files = tree_bytes(site)
            stripped = strip_site(site)
            left, left_files = tree_bytes(site)
            shadow = sorted(p.name for p in site.iterdir()
                            if p.name in {q.name for q in ROOT.iterdir()} | {"rl_pipeline"})
            if shadow:
                print(f"  WARNING site{bundle}: top-level {shadow} share a name with the "
                      f"repository's own folders")
            packed = pack(site, txz, threads=args.xz_threads)
            seconds[f"pack {bundle}"] = packed["seconds"]
            sites[bundle] = {
                "txz": _rel(txz), "packages": len(items),
                "wheel_bytes": sum(wheel_paths[i.name].stat().st_size for i in items),
                "installed_bytes": installed, "installed_files": installed_files,
                "stripped_bytes": stripped, "left_bytes": left, "left_files": left_files,
                "packed_bytes": packed["bytes"], "pack_tool": packed["tool"],
                "pack_seconds": packed["seconds"], "pack_cpu_seconds": packed["cpu_seconds"]}
            print(f"site{bundle}: {len(items)} wheels {sites[bundle]['wheel_bytes'] / MiB:.1f} "
                  f"MiB -> installed {installed / MiB:.1f} MiB -> stripped "
                  f"{sum(stripped.values()) / MiB:.1f} MiB -> {left / MiB:.1f} MiB in "
                  f"{left_files} files -> {txz.name} {packed['bytes']:,} B "
                  f"({packed['bytes'] / MiB:.2f} MiB, {packed['tool']}, {packed['seconds']} s, "
                  f"{packed['cpu_seconds']} s CPU)",
                  flush=True)
            for rule, n in stripped.items():
                print(f"    stripped {n / MiB:8.2f} MiB  {rule}")

    model: dict[str, Any] | None = None
    if args.model and args.model.is_file():
        t = time.perf_counter()
        parts = split_file(args.model, out, args.part_size)
        seconds["split model"] = round(time.perf_counter() - t, 1)
        model = {"file": _rel(args.model), "bytes": args.model.stat().st_size,
                 "sha256": _recorded_sha256(parts[0].parent / f"{args.model.name}.sha256"),
                 "parts": [{"path": _rel(p), "bytes": p.stat().st_size} for p in parts]}
        print(f"model {args.model.name}: {model['bytes']:,} B in {len(parts)} parts: "
              + ", ".join(_rel(p) for p in parts))
    elif args.model:
        print(f"model {args.model}: not there (make model fetches it); no model parts")

    tree = repo_tree_bytes(ROOT)
    folders = {_rel(p): tree_bytes(p)[0] for p in sorted(out.iterdir()) if p.is_dir()}
    rows, ok = check_uploads(folders, tree["total"])
    print(f"\nworking tree: {tree['tracked']:,} B tracked + {tree['untracked']:,} B untracked "
          f"not ignored ({tree['files']} files)")
    print(format_table(rows, tree["total"]))
    if any(r["status"] == "WARN" for r in rows):
        print(f"WARNING: an upload is above {UPLOAD_WARN / MiB:.0f} MiB: little room left")
    if not ok:
        print("FAIL: an upload is over the cap; move siteK.txz into its own folder (upload 2) "
              "or carry less")
    seconds["total"] = round(time.perf_counter() - start, 1)
    _write_json(out / "first-light.json", {
        "image": _rel(args.image), "lock": _rel(LOCK), "bundles_list": _rel(args.bundles),
        "python_version": args.python_version, "platforms": platforms,
        "wheels": [{"name": i.name, "version": i.version, "bundle": i.bundle,
                    "file": wheel_paths[i.name].name,
                    "bytes": wheel_paths[i.name].stat().st_size} for i in plan.items],
        "skipped": plan.skipped, "kept_despite_image": plan.kept,
        "sites": sites, "model": model, "tree": tree, "uploads": rows, "within_cap": ok,
        "requires_dist": report, "seconds": seconds})
    print(f"build {seconds['total']} s ({', '.join(f'{k} {v} s' for k, v in seconds.items())});"
          f" {_rel(out / 'first-light.json')}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", type=Path, default=DEFAULT_IMAGE,
                        help="the image's package list (name==version or name lines)")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="a file to split into upload parts (skipped when absent)")
    parser.add_argument("--no-model", dest="model", action="store_const", const=None)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--glibc", default="2.28", help="newest manylinux glibc to accept")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--bundles", type=Path, default=BUNDLE_LIST)
    parser.add_argument("--part-size", type=int, default=PART_SIZE)
    parser.add_argument("--xz-threads", type=int, default=0, help="0: one per core")
    args = parser.parse_args(argv)
    try:
        return build(args)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
