"""The vLLM set: the smallest set of packages that lets verl's vLLM rollout start on the lent
GPU image once the first-light bundles are there, found by importing, cut into parts that
each travel beside the repository; vLLM starts once all three have arrived (docs/gpu.md,
"The vLLM set").

    python scripts/vllm_set.py [--image requirements/images/lent-h100.freeze] [--out .gpu]
                               [--grow] [--probe-only] [--keep fa2,moe]
    python3 scripts/vllm_set.py receive --site /tmp/fl-site FOLDER [FOLDER ...]   (the box)

Building (this machine):
    1. the set is requirements/vllm-set.txt, versions from requirements/gpu.lock, minus what
       the image or the first-light bundles already have;
    2. **probe**: installs the set for this interpreter into a probe site and imports
       PROBE_MODULES (verl's vLLM server, vLLM's engine, worker, model runner, the Qwen2 and
       Llama models, the attention backends, LoRA, the sampler, torch.compile's backend) with
       scripts/import_probe.py: only the image's packages (and what they require), the
       first-light bundles and the set are visible. vLLM's CUDA kernels cannot load on a CPU
       torch: they are stood in for, and vLLM's platform is set to CUDA, so that the Python
       that imports them is traced. A module still missing fails the build; with --grow its
       distribution (from requirements/gpu.lock) is added and the probe repeats until nothing
       is missing, and the names to add to the list are printed. Then once per kernel with
       it absent (needed_at_import): what fails without it, so which units the box needs
       before vLLM imports;
    3. installs the set for the box (CPython 3.12, manylinux x86_64), strips what a Hopper
       run of a dense model never loads (STRIP_VLLM: other GPUs' kernels, MoE and MLA
       kernels, the Rust frontend; --keep brings some back) and packs it as UNITS, each an
       xz tar that unpacks into the site: the Python, the core kernels (vLLM imports: its
       CUDA platform loads them unguarded), the FlashAttention-3 kernels (verl's vLLM
       server imports vllm.vllm_flash_attn, which needs them; vLLM's default attention on
       Hopper);
    4. streams the units into upload folders OUT/v1, OUT/v2, ... of at most PART_BUDGET each
       (a unit larger than the room left is split into `<unit>.part-aa`, `-ab` with their
       sha256 only if it is larger than a whole upload), prints each upload with the working
       tree added and writes OUT/vllm-set.json.

On the box, after each upload (`cp .gpu/vN/* /tmp/parts/`), `receive` unpacks every unit
whose pieces are all there (checked against their sha256) into the site, once, and says what
now works (scripts/gpu_first_light.py does this itself before its rungs). This part imports
only the standard library and first_light_bundle's standard-library helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import first_light_bundle as flb  # noqa: E402  (its helpers; the standard library only)

ROOT = flb.ROOT
SET_LIST = ROOT / "requirements/vllm-set.txt"
MiB = flb.MiB
# One upload carries a folder and the working tree (about 7.5 MiB): 64 MiB in all, and
# first_light_bundle warns above 62.
PART_BUDGET = 54 * MiB

# What verl's vLLM rollout imports on the box, and why each is on the path. The string-named
# ones (worker, attention backends, punica wrapper) are what vLLM's CUDA platform resolves
# by name at start-up (vllm/platforms/cuda.py, vllm/v1/attention/backends/registry.py).
PROBE_MODULES: list[tuple[str, str]] = [
    ("verl.workers.rollout.vllm_rollout.vllm_async_server", "verl's vLLM replica and server"),
    ("vllm.entrypoints.openai.api_server", "the OpenAI-compatible server verl starts"),
    ("vllm.entrypoints.openai.cli_args", "the `vllm serve` arguments verl builds"),
    ("vllm.v1.engine.async_llm", "the engine client"),
    ("vllm.v1.engine.core", "the engine core process"),
    ("vllm.v1.executor.multiproc_executor", "the executor"),
    ("vllm.v1.worker.gpu_worker", "CudaPlatform's worker_cls"),
    ("vllm.v1.worker.gpu_model_runner", "the model runner"),
    ("vllm.v1.attention.backends.flash_attn", "Hopper's default attention backend"),
    ("vllm.v1.attention.backends.triton_attn", "the fallback attention backend"),
    ("vllm.model_executor.models.qwen2", "Qwen2 (conf/smoke's Qwen2.5-0.5B, the tiny model)"),
    ("vllm.model_executor.models.llama", "Llama (SmolLM2-135M)"),
    ("vllm.lora.worker_manager", "LoRA adapters (verl syncs the adapter)"),
    ("vllm.lora.punica_wrapper.punica_gpu", "CudaPlatform's punica wrapper for LoRA"),
    ("vllm.v1.sample.sampler", "sampling"),
    ("vllm.compilation.backends", "torch.compile's backend (vLLM compiles the model)"),
    ("vllm.distributed.device_communicators.cuda_communicator", "the CUDA communicator"),
    ("vllm.model_executor.model_loader.default_loader", "safetensors weights"),
]
# vLLM's CUDA kernels (loaded at import by vllm/platforms/cuda.py): cannot load on a CPU torch.
STAND_INS = ["vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C"]
OP_NAMESPACES = ["_C", "_C_cache_ops", "_C_custom_ar", "_vllm_fa3_C"]
PLATFORM = "vllm.platforms.cuda.CudaPlatform"
CAPABILITY = "9.0"  # the H100's: vLLM picks kernels by it at import time
# Top-level modules whose distribution has another name, for --grow where this environment
# does not have the distribution installed to say so.
ALIASES = {"tvm_ffi": "apache-tvm-ffi", "zmq": "pyzmq", "cv2": "opencv-python-headless",
           "PIL": "pillow", "yaml": "pyyaml", "google": "protobuf",
           "pythonjsonlogger": "python-json-logger", "cpuinfo": "py-cpuinfo"}

# Removed from the installed vLLM: (path under the site, why a Hopper run of a dense model
# never loads it, the --keep name that brings it back or None).
STRIP_VLLM: list[tuple[str, str, str | None]] = [
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FlashAttention-2: Ampere and older; Hopper "
     "uses FA3 (fa_utils.get_flash_attn_version); imported in a try block", "fa2"),
    ("vllm/_moe_C_stable_libtorch.abi3.so", "mixture-of-experts kernels; imported in "
     "contextlib.suppress(ImportError)", "moe"),
    ("vllm/_flashmla_C.abi3.so", "MLA attention (DeepSeek models)", None),
    ("vllm/_qutlass_C.abi3.so", "FP4 quantisation kernels; imported in a try block", None),
    ("vllm/third_party/fmha_sm100", "Blackwell (sm100) attention", None),
    ("vllm/third_party/deep_gemm", "DeepGEMM FP8 kernels, loaded only when available", None),
    ("vllm/vllm-rs", "the Rust frontend, used only with VLLM_RUST_FRONTEND_PATH", None),
]
STRIP_GLOBS = [
    ("*.cpython-3*-*.so", "an extension for another Python version"),
    ("*.a", "a static library (xgrammar's 62 MiB libxgrammar.a): for linking, never loaded"),
]


@dataclass(frozen=True)
class Unit:
    """One xz tar that unpacks into the site, and what works once it is there."""

    name: str
    paths: tuple[str, ...]  # under the site; () = everything the other units do not take
    enables: str


# On the box nothing of vLLM imports before all three of the first units are there (the
# lent H100, 2026-11-28): vllm/platforms/cuda.py imports _C_stable_libtorch unguarded, and
# verl's vLLM server reaches vllm.vllm_flash_attn (vllm.lora -> mm_encoder_attention ->
# fa_utils), which raises ImportError without an FA2 or FA3 extension. The stand-ins hid
# both (needed_at_import finds them now); the uploads are one set, not steps.
UNITS = [
    Unit("vllm-python.txz", (), "vLLM's Python and its dependencies (nothing of vLLM "
         "imports on a GPU before the core kernels are there)"),
    Unit("vllm-core-kernels.txz", ("vllm/_C_stable_libtorch.abi3.so",),
         "vLLM imports and its CUDA platform loads"),
    Unit("vllm-fa3.txz", ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",),
         "FlashAttention-3: verl's vLLM server imports (vllm.vllm_flash_attn needs FA2 or "
         "FA3) and vLLM's default attention on Hopper"),
    Unit("vllm-fa2.txz", ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",),
         "FlashAttention-2 (--keep fa2: Ampere cards)"),
    Unit("vllm-moe.txz", ("vllm/_moe_C_stable_libtorch.abi3.so",),
         "mixture-of-experts kernels (--keep moe)"),
]


# --- the set and what is visible on the box ---------------------------------------------

def read_set(path: Path = SET_LIST) -> list[str]:
    """requirements/vllm-set.txt's names (one section, `# [V]`)."""
    bundles = flb.parse_bundles(path.read_text())
    return [n for names in bundles.values() for n in names]


def first_light_names() -> set[str]:
    return {n for names in flb.parse_bundles(flb.BUNDLE_LIST.read_text()).values()
            for n in names}


# --- the probe: a venv built like the box -------------------------------------------------

# The image's CUDA libraries have no use on a CPU; its torch is the CPU build of this
# machine (constraints-cpu.txt), another version than the image's 2.11.
NOT_ON_CPU = re.compile(r"^(nvidia-.*|cuda-.*|torch)$")


def _venv_pip(venv: Path, *args: str) -> None:
    proc = subprocess.run([str(venv / "bin/python"), "-m", "pip", *args, "--no-input",
                           "--progress-bar", "off", "--disable-pip-version-check", "-q"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args[:3])} ... in {venv} failed:\n"
                           f"    {flb._tail(proc, 12)}")


def box_venv(work: Path, image: dict[str, str | None], lock: dict[str, str],
             cache: Path) -> Path:
    """A venv like the box before the set: the image's packages with everything they
    require (pip resolves them at the lock's versions; this machine's CPU torch for the
    image's CUDA one), then the first-light bundles with --no-deps, as they travel.
    Built once, reused while the image list, the first-light list and the lock are the
    same."""
    venv = work / "box"
    key = flb.sha256_of(flb.DEFAULT_IMAGE) + flb.sha256_of(flb.BUNDLE_LIST) + \
        flb.sha256_of(flb.LOCK)
    stamp = venv / ".box-inputs"
    if stamp.is_file() and stamp.read_text() == key:
        return venv
    if venv.exists():
        shutil.rmtree(venv)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # This environment's versions: installable on this Python (the lock is for 3.12; some
    # of its pins need 3.12), close to the box's; what travels is pinned by the lock below.
    here = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze",
                           "--exclude-editable", "--disable-pip-version-check"],
                          capture_output=True, text=True, check=True).stdout
    constraints = work / "box-constraints.txt"
    constraints.write_text(here)
    names = [n for n in image if not NOT_ON_CPU.match(n) or n == "torch"]
    _venv_pip(venv, "install", "-c", str(constraints), *names)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    platforms = flb.manylinux_platforms("2.35")
    plan = flb.make_plan(flb.parse_bundles(flb.BUNDLE_LIST.read_text()), lock, image)
    wheels = flb.fetch_wheels(plan.items, cache, python, platforms)
    _venv_pip(venv, "install", "--no-deps", "--no-index", *map(str, wheels.values()))
    stamp.write_text(key)
    print(f"box venv {venv}: built in {time.perf_counter() - t:.0f} s", flush=True)
    return venv


def box_packages(venv: Path) -> dict[str, str]:
    """{name: version} installed in the box venv."""
    out = subprocess.run([str(venv / "bin/python"), "-m", "pip", "list", "--format=freeze",
                          "--disable-pip-version-check"], capture_output=True, text=True,
                         check=True).stdout
    return {k: v for k, v in flb.parse_image(out).items() if v}


def run_probe(venv: Path, site: Path, out: Path, absent: Sequence[str] = ()
              ) -> dict[str, Any]:
    """scripts/import_probe.py on PROBE_MODULES in the box venv, the set's ``site`` first;
    the ``absent`` modules treated as not there."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(site), VLLM_LOGGING_LEVEL="ERROR",
               TRANSFORMERS_VERBOSITY="error")
    command = [str(venv / "bin/python"), str(ROOT / "scripts/import_probe.py"),
               "--json", str(out), "--platform", PLATFORM, "--capability", CAPABILITY,
               *(a for s in STAND_INS for a in ("--stand-in", s)),
               *(a for s in OP_NAMESPACES for a in ("--stub-ops", s)),
               *(a for s in absent for a in ("--absent", s)),
               *(m for m, _ in PROBE_MODULES)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if not out.is_file():
        raise RuntimeError(f"the import probe wrote nothing:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def distribution_of(module: str, lock: dict[str, str]) -> str | None:
    """The locked distribution that provides top-level ``module``: this environment's
    metadata knows most (it has the whole GPU set's CPU part), else the module's own name."""
    from importlib.metadata import packages_distributions

    for dist in [*packages_distributions().get(module, []), ALIASES.get(module, module)]:
        if flb.normalize(dist) in lock:
            return flb.normalize(dist)
    return None


def probe_set(names: list[str], lock: dict[str, str], venv: Path, work: Path,
              cache: Path, grow: bool, rounds: int = 20) -> dict[str, Any]:
    """Install the set (this interpreter's wheels) into a site of its own and probe; with
    ``grow``, add each missing module's distribution and probe again."""
    site = work / "vllm-probe"
    if site.exists():
        shutil.rmtree(site)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    platforms = flb.manylinux_platforms("2.35")
    added: dict[str, str] = {}
    history = []
    installed: set[str] = set()
    for i in range(1, rounds + 1):
        todo = [flb.Item(n, lock[n], "V") for n in names if n not in installed]
        if todo:
            wheels = flb.fetch_wheels(todo, cache, python, platforms)
            flb.install(wheels.values(), site, python, platforms)
            installed |= {t.name for t in todo}
            strip_vllm(site, keep=())
        t = time.perf_counter()
        result = run_probe(venv, site, work / f"probe-{i}.json")
        needed: dict[str, str] = {}
        unknown: list[str] = []
        for entry in result["modules"].values():
            if entry["status"] == "missing":
                dist = distribution_of(entry["module"], lock)
                why = f"{entry['module']} ({_short(entry['by'])})"
                if dist and dist not in names:
                    needed.setdefault(dist, why)
                else:
                    unknown.append(why)
        errors = {m: e for m, e in result["modules"].items() if e["status"] == "error"}
        ok = sum(e["status"] == "ok" for e in result["modules"].values())
        history.append({"round": i, "imported": ok, "of": len(result["modules"]),
                        "missing": needed, "unknown": unknown,
                        "seconds": round(time.perf_counter() - t, 1)})
        print(f"probe {i}: {ok}/{len(result['modules'])} modules import"
              + "".join(f"; missing {d} for {why}" for d, why in needed.items())
              + "".join(f"; NOT IN THE LOCK {u}" for u in unknown), flush=True)
        if unknown or not needed or not grow:
            return {"result": result, "history": history, "added": added, "errors": errors,
                    "clean": not needed and not unknown and not errors}
        for dist, why in needed.items():
            names.append(dist)
            added[dist] = why
    raise RuntimeError(f"the probe still misses packages after {rounds} rounds: {history[-1]}")


def unit_of(module: str) -> str | None:
    """The unit that carries ``module`` (a native extension: its path names it), if any."""
    stem = module.replace(".", "/") + "."
    return next((u.name for u in UNITS if any(p.startswith(stem) for p in u.paths)), None)


def needed_at_import(venv: Path, site: Path, work: Path) -> dict[str, dict[str, Any]]:
    """For each stood-in extension: the probe again with it absent, as on a box where its
    unit has not arrived. A stand-in hides whether the Python needs it: on the lent H100
    vLLM did not import without the core kernels (an unguarded import), nor verl's vLLM
    server without FlashAttention (in a try block whose handler raises anyway)."""
    needed = {}
    for module in STAND_INS:
        result = run_probe(venv, site, work / f"probe-without-{module}.json", [module])
        failed = {m: e for m, e in result["modules"].items() if e["status"] != "ok"}
        first = next(iter(failed.items()), None)
        needed[module] = {
            "unit": unit_of(module), "failed": sorted(failed), "of": len(result["modules"]),
            "first": None if first is None else
            f"{first[0]}: {first[1].get('error') or first[1].get('message')} at "
            f"{_short(first[1].get('at') or first[1].get('by') or '?')}"}
    return needed


def deferred_imports(files: Sequence[str], roots: Sequence[str] = ("vllm", "verl")
                     ) -> dict[str, list[str]]:
    """{top-level module: [file:line, ...]} imported inside functions of the loaded
    ``files`` of ``roots``: what the probe's imports did not execute and a run may."""
    import ast

    found: dict[str, list[str]] = {}
    for file in files:
        parts = Path(file).parts
        at = [i for i, part in enumerate(parts[:-1]) if part in roots]
        if not at:
            continue
        rel = "/".join(parts[at[0]:])
        try:
            tree = ast.parse(Path(file).read_text(), file)
        except (OSError, SyntaxError):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and \
                    not node.level else []
                for name in names:
                    found.setdefault(name.split(".")[0], []).append(f"{rel}:{node.lineno}")
    return found


def _short(where: str) -> str:
    for marker in ("site-packages/", "/vllm-probe/"):
        if marker in where:
            return where.split(marker, 1)[1]
    return where


# --- the parts ----------------------------------------------------------------------------

def strip_vllm(site: Path, keep: Sequence[str]) -> dict[str, int]:
    """Delete STRIP_VLLM's paths (but those --keep names) and other Pythons' extensions."""
    removed: dict[str, int] = {}
    for rel, why, name in STRIP_VLLM:
        path = site / rel
        if (name and name in keep) or not (path.exists() or path.is_symlink()):
            continue
        removed[f"{rel}: {why}"] = flb.tree_bytes(path)[0]
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


def strip_other_pythons(site: Path, python_version: str) -> dict[str, int]:
    tag = "cpython-" + python_version.replace(".", "")
    removed: dict[str, int] = {}
    for pattern, why in STRIP_GLOBS:
        for path in site.rglob(pattern):
            if path.suffix == ".a" or tag not in path.name:
                removed[why] = removed.get(why, 0) + path.stat().st_size
                path.unlink()
    return removed


def pack_units(site: Path, units: Sequence[Unit], staging: Path,
               threads: int = 0) -> list[dict[str, Any]]:
    """Each unit's paths (the first unit: the rest) moved into a tree of its own and packed."""
    packed = []
    for unit in units[1:]:
        tree = staging / unit.name
        for rel in unit.paths:
            if (site / rel).exists():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(site / rel), tree / rel)
    for unit in units:
        tree = site if not unit.paths else staging / unit.name
        if not tree.is_dir():
            continue
        raw = flb.tree_bytes(tree)[0]
        info = flb.pack(tree, staging / "out" / unit.name, threads=threads)
        packed.append({"unit": unit.name, "enables": unit.enables, "raw_bytes": raw,
                       "bytes": info["bytes"], "path": staging / "out" / unit.name,
                       "pack_seconds": info["seconds"]})
        print(f"  {unit.name}: {raw / MiB:.1f} MiB -> {info['bytes'] / MiB:.1f} MiB "
              f"({info['seconds']} s)", flush=True)
    return packed


def stream_into_folders(units: Sequence[dict[str, Any]], out: Path,
                        budget: int = PART_BUDGET, first: int = 1) -> list[dict[str, Any]]:
    """Units in order into folders out/v<first>, v<first+1>, ..., each at most ``budget``
    bytes. A unit that does not fit the room left goes whole into the next folder when it
    fits one, else it is split from here on (`.part-aa`, `-ab`, ...); so each unit is
    usable as soon as the upload with its last piece has arrived, and only a unit larger
    than an upload spans several. Every unit and piece gets its `.sha256` (a split unit also
    `<unit>.pieces`, how many to wait for)."""
    folders: list[dict[str, Any]] = []
    index, room = first, budget

    def folder() -> Path:
        path = out / f"v{index}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    for unit in units:
        src: Path = unit["path"]
        size = src.stat().st_size
        digest = flb.sha256_of(src)
        if room < size <= budget:  # whole in the next folder rather than split
            index, room = index + 1, budget
        if size <= room:
            dest = folder() / src.name
            shutil.copyfile(src, dest)
            (dest.parent / f"{src.name}.sha256").write_text(f"{digest}  {src.name}\n")
            room -= size
            unit["pieces"] = [flb._rel(dest)]
            continue
        pieces = []
        offset = 0
        with open(src, "rb") as f:
            while offset < size:
                if room < min(MiB, budget // 16):  # not worth a piece: the next folder
                    index, room = index + 1, budget
                n = min(room, size - offset)
                piece = folder() / f"{src.name}.part-{flb._suffix(len(pieces))}"
                with open(piece, "wb") as dst:
                    left = n
                    while left:
                        block = f.read(min(1 << 20, left))
                        dst.write(block)
                        left -= len(block)
                (piece.parent / f"{piece.name}.sha256").write_text(
                    f"{flb.sha256_of(piece)}  {piece.name}\n")
                (piece.parent / f"{src.name}.sha256").write_text(f"{digest}  {src.name}\n")
                pieces.append(piece)
                offset += n
                room -= n
        for folder_path in {p.parent for p in pieces}:  # how many to wait for
            (folder_path / f"{src.name}.pieces").write_text(f"{len(pieces)}\n")
        unit["pieces"] = [flb._rel(p) for p in pieces]
    for path in sorted(out.glob("v*")):
        if path.is_dir() and re.fullmatch(r"v\d+", path.name):
            folders.append({"folder": flb._rel(path), "bytes": flb.tree_bytes(path)[0]})
    return folders


# --- the box: receiving -------------------------------------------------------------------

# A unit's file, whole or one piece of it (``vllm-core-kernels.txz.part-ab``).
UNIT_FILE = r"(vllm-[\w-]+\.txz)(?:\.part-([a-z]{2}))?"


def complete_units(folders: Sequence[Path]) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """({unit: its file or pieces} for each unit whose pieces are all here,
    {unit: what is missing} for the others)."""
    # The same file can be in two folders: docs/gpu.md's sequence copies each upload's
    # files to /tmp/parts, and the upload's own folder is read too (on the lent H100 the
    # core kernels waited with "pieces aa, aa, ab, ab of 2" and never unpacked). The first
    # folder's copy counts; each piece is checked against its sha256 when it is joined.
    pieces: dict[str, dict[str, Path]] = {}
    whole: dict[str, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            m = re.fullmatch(UNIT_FILE, p.name)
            if not m:
                continue
            if m.group(2):
                pieces.setdefault(m.group(1), {}).setdefault(m.group(2), p)
            else:
                whole.setdefault(m.group(1), p)
    ready = {name: [path] for name, path in whole.items()}
    waiting: dict[str, str] = {}
    for name, by_suffix in pieces.items():
        if name in ready:
            continue
        parts = list(by_suffix.values())
        suffixes = sorted(re.sub(r".*\.part-", "", p.name) for p in parts)
        counts = {p.with_name(f"{name}.pieces").read_text().strip() for p in parts
                  if p.with_name(f"{name}.pieces").is_file()}
        want = int(counts.pop()) if len(counts) == 1 else None
        if want is not None and suffixes == [flb._suffix(i) for i in range(want)]:
            ready[name] = sorted(parts, key=lambda p: p.name)
        else:
            waiting[name] = (f"have pieces {', '.join(suffixes)} of "
                             f"{want if want is not None else '?'}")
    return ready, waiting


def receive(folders: Sequence[Path], site: Path) -> dict[str, Any]:
    """Unpack every complete unit into ``site`` once; what is unpacked and what waits."""
    ready, waiting = complete_units(folders)
    done = []
    for name, files in sorted(ready.items(), key=lambda kv: _unit_order(kv[0])):
        marker = site / f".unpacked-{name}"
        if marker.exists():
            done.append(name)
            continue
        site.mkdir(parents=True, exist_ok=True)
        if len(files) == 1 and files[0].name == name:
            want = flb._recorded_sha256(files[0].with_name(f"{name}.sha256"))
            if flb.sha256_of(files[0]) != want:
                waiting[name] = f"{files[0]}: sha256 is not the recorded one (truncated?)"
                continue
            archive = files[0]
            flb.unpack(archive, site)
        else:
            with tempfile.TemporaryDirectory(dir=site.parent) as tmp:
                archive = flb.join_parts(files, Path(tmp) / name)
                flb.unpack(archive, site)
        marker.touch()
        done.append(name)
    return {"unpacked": done, "waiting": waiting,
            "enables": [u.enables for u in UNITS if u.name in done]}


def check_cover(folders: Sequence[Path], loaded: Sequence[str], probe_site: Path
                ) -> dict[str, Any]:
    """Receive the upload folders into a scratch site as the box would, and check that
    every Python file the probe imported from the set is there."""
    with tempfile.TemporaryDirectory(prefix="vllm-receive-") as tmp:
        site = Path(tmp) / "site"
        received = receive(folders, site)
        wanted = [Path(f).relative_to(probe_site) for f in loaded
                  if Path(f).is_relative_to(probe_site)]
        absent = [str(w) for w in wanted if not (site / w).is_file()]
    return {"received": received["unpacked"], "waiting": received["waiting"],
            "probe_files": len(wanted), "absent": absent}


def _unit_order(name: str) -> int:
    return next((i for i, u in enumerate(UNITS) if u.name == name), len(UNITS))


# --- the build ----------------------------------------------------------------------------

def build(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    lock = flb.parse_lock(flb.LOCK.read_text())
    image = flb.parse_image(args.image.read_text())
    listed = read_set(args.set)
    not_pinned = [n for n in listed if n not in lock]
    if not_pinned:
        raise ValueError(f"{args.set.name}: not pinned in {flb.LOCK.name}: {not_pinned}")
    first_light = first_light_names()
    names = [n for n in listed if n not in first_light]
    args.work.mkdir(parents=True, exist_ok=True)
    venv = box_venv(args.work, image, lock, args.cache)
    box = box_packages(venv)
    print(f"the box before the set (a venv like it: {venv}): {len(box)} packages, the image's "
          f"{len(image)} with what they require and the first-light bundles' {len(first_light)}")
    probe = probe_set(names, lock, venv, args.work, args.cache, args.grow)
    report: dict[str, Any] = {
        "set": names, "added_by_grow": probe["added"], "probe_rounds": probe["history"],
        "probe": {"modules": {m: {"status": e["status"], "guarded": e["guarded"]}
                              for m, e in probe["result"]["modules"].items()},
                  "stand_ins": probe["result"]["stand_ins"],
                  "platform": probe["result"].get("platform"),
                  "python": probe["result"]["python"]}}
    deferred = deferred_imports(probe["result"].get("loaded_files", []))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    absent = flb.missing_modules(str(venv / "bin/python"),
                                 {**env, "PYTHONPATH": str(args.work / "vllm-probe")},
                                 sorted(deferred))
    vllm_requires = {flb.normalize(r.split(";")[0].split("[")[0].split(" ")[0].split("=")[0]
                                   .split("<")[0].split(">")[0])
                     for r in flb.wheel_requires(next(args.cache.glob("vllm-*.whl")))
                     if "extra ==" not in r}
    report["deferred_imports_absent"] = {
        m: {"at": deferred[m][:3], "count": len(deferred[m]),
            "vllm_requires_it": (distribution_of(m, lock) or m) in vllm_requires}
        for m in absent}
    risky = [m for m in absent if report["deferred_imports_absent"][m]["vllm_requires_it"]]
    print(f"imported inside functions of the loaded vllm/verl files and not on the box: "
          f"{len(absent)} modules; of them in vLLM's own requirements (a run could need "
          f"them): {', '.join(f'{m} ({deferred[m][0]})' for m in risky) or 'none'}")
    if probe["added"]:
        print("add to requirements/vllm-set.txt:\n" + "\n".join(
            f"# {why}\n{d}" for d, why in probe["added"].items()))
    for module, entry in probe["errors"].items():
        print(f"  ERROR importing {module}: {entry['error']} at {_short(entry['at'])}")
    guarded = sorted({g for e in probe["result"]["modules"].values() for g in e["guarded"]})
    print(f"guarded imports met (optional, left out): {', '.join(guarded) or 'none'}")
    if not probe["clean"]:
        print("FAIL: the probe does not import everything (above)")
        _write(args, report, start)
        return 1
    needed = needed_at_import(venv, args.work / "vllm-probe", args.work)
    report["needed_at_import"] = needed
    for module, n in needed.items():
        print(f"without {module} ({n['unit']}): "
              + (f"{len(n['failed'])} of {n['of']} probe modules fail to import, e.g. "
                 f"{n['first']}" if n["failed"] else f"all {n['of']} probe modules import"))
    if args.probe_only:
        _write(args, report, start)
        return 0

    python, platforms = args.python_version, flb.manylinux_platforms("2.35")
    items = [flb.Item(n, lock[n], "V") for n in names]
    wheels = flb.fetch_wheels(items, args.cache, python, platforms)
    requires = flb.requires_report({i.name: (i.version, wheels[i.name]) for i in items},
                                   {i.name: i.version for i in items} |
                                   {n: lock[n] for n in first_light if n in lock},
                                   {**box, **{n: v for n, v in image.items() if v}},
                                   python)
    report["requires_dist_not_carried"] = sorted(requires["unresolved"])
    print(f"Requires-Dist of the set that stays out (no import on the path needs it): "
          f"{', '.join(sorted(requires['unresolved'])) or 'none'}")
    out: Path = args.out
    for old in out.glob("v*"):
        if old.is_dir() and re.fullmatch(r"v\d+", old.name):
            shutil.rmtree(old)
    with tempfile.TemporaryDirectory(prefix="vllm-set-") as tmp:
        site = Path(tmp) / "site"
        flb.install(wheels.values(), site, python, platforms)
        installed = flb.tree_bytes(site)[0]
        stripped = {**flb.strip_site(site), **strip_vllm(site, args.keep),
                    **strip_other_pythons(site, python)}
        print(f"installed {installed / MiB:.1f} MiB; stripped "
              f"{sum(stripped.values()) / MiB:.1f} MiB:")
        for rule, n in stripped.items():
            print(f"    {n / MiB:8.2f} MiB  {rule}")
        units = pack_units(site, UNITS, Path(tmp), threads=args.xz_threads)
        folders = stream_into_folders(units, out)
    for u in units:
        u.pop("path")
    cover = check_cover([Path(f["folder"]) for f in folders],
                        probe["result"].get("loaded_files", []), args.work / "vllm-probe")
    print(f"received as the box would ({', '.join(cover['received'])}): "
          f"{cover['probe_files'] - len(cover['absent'])} of the {cover['probe_files']} "
          f"Python files the probe imported from the set are there"
          + (f"; ABSENT: {cover['absent'][:10]}" if cover["absent"] else ""))
    report["cover"] = cover
    tree = flb.repo_tree_bytes(ROOT)
    rows, ok = flb.check_uploads({f["folder"]: f["bytes"] for f in folders}, tree["total"])
    print(flb.format_table(rows, tree["total"]))
    for u in units:
        print(f"  {u['unit']} ({u['bytes'] / MiB:.1f} MiB) in {', '.join(u['pieces'])}: "
              f"{u['enables']}")
    before = ["vllm-python.txz", *sorted({n["unit"] for n in needed.values() if n["failed"]},
                                         key=_unit_order)]
    last = max((Path(p).parent.name for u in units if u["unit"] in before for p in u["pieces"]),
               key=lambda folder: int(folder[1:]))
    print(f"verl's vLLM rollout imports once {', '.join(before)} are there: from upload "
          f"{last} on")
    report.update(installed_bytes=installed, stripped=stripped, units=units, uploads=rows,
                  within_cap=ok, tree=tree)
    _write(args, report, start)
    return 0 if ok and not cover["absent"] and not cover["waiting"] else 1


def _write(args: argparse.Namespace, report: dict[str, Any], start: float) -> None:
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    flb._write_json(args.out / "vllm-set.json", report)
    print(f"vllm-set {report['seconds']} s; {flb._rel(args.out / 'vllm-set.json')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["receive"]:
        parser = argparse.ArgumentParser(prog="vllm_set.py receive")
        parser.add_argument("folders", nargs="+", type=Path)
        parser.add_argument("--site", type=Path, default=Path("/tmp/fl-site"))
        args = parser.parse_args(argv[1:])
        print(json.dumps(receive(args.folders, args.site), indent=1))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", type=Path, default=flb.DEFAULT_IMAGE)
    parser.add_argument("--set", type=Path, default=SET_LIST)
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--work", type=Path,
                        default=Path.home() / ".cache/rl_pipeline/vllm-set/work")
    parser.add_argument("--cache", type=Path, default=flb.DEFAULT_CACHE)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--grow", action="store_true",
                        help="add each missing distribution and probe again")
    parser.add_argument("--probe-only", action="store_true")
    parser.add_argument("--keep", type=lambda v: [s for s in v.split(",") if s], default=[],
                        help="stripped kernels to carry anyway: fa2 (Ampere), moe")
    parser.add_argument("--xz-threads", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        return build(args)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
