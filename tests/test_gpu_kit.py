"""`make gpu-kit` (scripts/gpu_kit.py) and scripts/run_smoke.sh: the wheels a GPU image lacks
and a model, every part small enough to travel beside the working tree in one upload, and
run_smoke.sh installing them on a box with no index, whose python3 is itself a venv.

The package index is stood in for by local wheels (wheelhouse.fetch_one, its one network
call); the image by a venv made from this project's venv interpreter (a venv of a venv, as on
the box), holding a marker package nothing else has."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, load_script

SCRIPTS = PROJECT_ROOT / "scripts"
RUN_SMOKE = SCRIPTS / "run_smoke.sh"



def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of an importable package ``name``, as pip installs it."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
             .encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = [f"{k},sha256={_digest(v)},{len(v)}" for k, v in files.items()]
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return path


def _box_env(**extra: str) -> dict[str, str]:
    """The box sees only its own environment: no PYTHONPATH of this session, no index."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PIP_NO_INDEX": "1",
            **extra}


def _image(tmp_path: Path, *markers: Path, host_packages: bool = False) -> Path:
    """The box's image: a venv made from this project's venv interpreter, so that its python3
    is itself a venv, as on the box. It holds pip (through a .pth: the project venv's pip, or
    with ``host_packages`` the project venv's whole site-packages: torch, kedro, ... standing in
    for the image's) and ``markers``, installed into it and into nothing else."""
    assert sys.prefix != sys.base_prefix, "the tests run in the project's venv"
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image)], check=True)
    python = image / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    host = Path(sysconfig.get_path("purelib"))
    if host_packages:
        (site / "image.pth").write_text(f"{host}\n")
    else:
        only_pip = tmp_path / "image-pip"
        only_pip.mkdir()
        for entry in [host / "pip", *host.glob("pip-*.dist-info")]:
            (only_pip / entry.name).symlink_to(entry)
        (site / "image.pth").write_text(f"{only_pip}\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                    *map(str, markers)], check=True, env=_box_env())
    return python


def _build_kit(tmp_path: Path, monkeypatch, lock: str, freeze: str, model: str,
               part_size: int, *extra: str) -> tuple[int, Path]:
    """gpu_kit.main on a lock of tiny wheels made here (rlp_kit_a, rlp_kit_b: random payloads,
    so that the wheelhouse spans parts)."""
    gpu_kit = load_script("gpu_kit")
    wheelhouse = gpu_kit.wheelhouse
    made = tmp_path / "index"
    made.mkdir(exist_ok=True)
    rng = random.Random(0)
    wheels = {}
    for name in ("rlp_kit_a", "rlp_kit_b"):
        path = _wheel(made, name, "1.0")
        with zipfile.ZipFile(path, "a") as z:  # incompressible: the parts are really used
            z.writestr(f"{name}/payload.txt", rng.randbytes(48 * 2**10).hex())
        wheels[name] = path

    def from_local_index(name, version, stage, python_version, platforms):
        dest = stage / name
        dest.mkdir(parents=True, exist_ok=True)
        src = wheels[name.replace("-", "_")]
        shutil.copyfile(src, dest / src.name)
        return wheelhouse.Wheel(name, version, dest / src.name, "downloaded")

    monkeypatch.setattr(wheelhouse, "fetch_one", from_local_index)
    (tmp_path / "gpu.lock").write_text(lock)
    (tmp_path / "image.freeze").write_text(freeze)
    out = tmp_path / "kit"
    status = gpu_kit.main(["--freeze", str(tmp_path / "image.freeze"), "--out", str(out),
                           "--lock", str(tmp_path / "gpu.lock"), "--model", model,
                           "--part-size", str(part_size), *extra])
    return status, out


def _run_smoke(kit: Path, python: Path, logs: Path, script: Path = RUN_SMOKE, **extra: str):
    return subprocess.run(["bash", str(script), str(kit)], capture_output=True, text=True,
                          env=_box_env(PYTHON=str(python), LOGS=str(logs), **extra),
                          timeout=900)


def _in_kit_env(kit: Path, python: Path, code: str) -> subprocess.CompletedProcess:
    """``code`` on the image's python3 as run_smoke.sh runs everything (KIT/env.sh)."""
    return subprocess.run(["bash", "-c", f'. "{kit}/env.sh" && "{python}" -c "{code}"'],
                          capture_output=True, text=True, env=_box_env())


def test_the_freeze_decides_which_wheels_travel(tmp_path) -> None:
    wheelhouse = load_script("wheelhouse")
    freeze = tmp_path / "image.freeze"
    freeze.write_text("torch==2.11.0+cu130\npeft\nPandas  # version not known\n"
                      "transformers\ntokenizers==0.22.2\naccelerate==1.15.0\n")
    have = wheelhouse.read_freeze(freeze)
    assert have["peft"] == have["pandas"] == have["transformers"] == wheelhouse.ANY_VERSION
    pins = {"torch": "2.11.0", "peft": "0.21.2", "pandas": "2.3.3", "transformers": "5.9.0",
            "tokenizers": "0.22.2", "accelerate": "1.12.0", "verl": "0.9.1"}
    fetch, present, notes = wheelhouse.split_by_target(pins, have)
    # a name alone is present, except transformers (verl needs < 5.11) and tokenizers
    assert set(present) == {"torch", "peft", "pandas", "tokenizers"}
    assert set(fetch) == {"transformers", "accelerate", "verl"}
    assert any(n.startswith("transformers: the target has it at a version not known")
               for n in notes)

    # The lent image: nothing it has at the lock's version travels; transformers and
    # tokenizers (5.17.0 / 0.23.2 there, 5.9.0 / 0.22.2 in the lock) do.
    pins = load_script("gpu_lock").parse_lock((PROJECT_ROOT / "requirements/gpu.lock").read_text())
    image = wheelhouse.read_freeze(PROJECT_ROOT / "requirements/images/lent-h100.freeze")
    fetch, present, _ = wheelhouse.split_by_target(pins, image)
    assert {"transformers", "tokenizers"} <= set(fetch)
    assert {"torch", "triton", "nvidia-nccl-cu13"} <= set(present)
    assert not {name for name in fetch if name in image and (
        image[name] == wheelhouse.ANY_VERSION and name not in wheelhouse.EXACT_VERSION
        or wheelhouse.same_version(image[name].split("+")[0], pins[name]))}


def test_every_part_fits_one_upload_with_the_working_tree(tmp_path, monkeypatch) -> None:
    gguf = tmp_path / "Tiny.Q4_1.gguf"
    gguf.write_bytes(random.Random(1).randbytes(300 * 2**10))
    part = 64 * 2**10
    status, out = _build_kit(tmp_path, monkeypatch, "rlp-kit-a==1.0\nrlp-kit-b==1.0\n", "",
                             str(gguf), part)
    assert status == 0
    summary = json.loads((out / "kit.json").read_text())
    files = [p for p in out.rglob("*") if p.is_file()]
    assert summary["files"] == len(files) and max(p.stat().st_size for p in files) <= part
    assert not list(out.glob("project.tar*")) and not (out / "run_smoke.sh").exists()
    # the model travels as its GGUF file, split
    model = json.loads((out / "model.json").read_text())
    assert model["kind"] == "gguf" and model["file"] == gguf.name and len(model["parts"]) == 5
    assert b"".join((out / p["file"]).read_bytes() for p in model["parts"]) == gguf.read_bytes()
    # every part with the tree (tracked files at least) and the small files: one upload
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    tracked_bytes = sum((PROJECT_ROOT / n).stat().st_size for n in tracked
                        if n and (PROJECT_ROOT / n).is_file()
                        and not (PROJECT_ROOT / n).is_symlink())
    # (within what a concurrent edit of the checkout might change meanwhile)
    assert abs(summary["tree_bytes"]["tracked"] - tracked_bytes) < 2**20 < tracked_bytes
    parts = sorted(p.relative_to(out).as_posix() for p in files if ".part-" in p.name)
    assert [u["file"] for u in summary["uploads"]] == parts and len(parts) > 6
    for u in summary["uploads"]:
        assert u["with_tree_bytes"] == (u["bytes"] + summary["tree_bytes"]["total"]
                                        + summary["small_files_bytes"]) <= 64 * 2**20
    # a part that would not fit beside the tree fails the build
    tree_mib = summary["tree_bytes"]["total"] / 2**20
    status, _ = _build_kit(tmp_path, monkeypatch, "rlp-kit-a==1.0\n", "", str(gguf), part,
                           "--upload-limit", f"{tree_mib + 0.01:.2f}M")
    assert status == 1


@pytest.mark.slow  # package installs
def test_the_kit_installs_beside_an_image_python_that_is_itself_a_venv(
        tmp_path, monkeypatch) -> None:
    """The box's python3 is a venv: what the kit installs must be seen together with what
    only that venv has (a venv made from it would see its base interpreter's packages)."""
    (tmp_path / "older").mkdir()
    marker, older = _wheel(tmp_path, "rlp_kit_image", "2.0"), _wheel(tmp_path / "older",
                                                                     "rlp_kit_b", "0.9")
    python = _image(tmp_path, marker, older)  # the image: the marker, and rlp_kit_b 0.9
    assert subprocess.run([str(python), "-c", "import rlp_kit_image"],
                          env=_box_env()).returncode == 0
    gguf = tmp_path / "Tiny.Q4_1.gguf"
    gguf.write_bytes(random.Random(2).randbytes(150 * 2**10))
    status, kit = _build_kit(tmp_path, monkeypatch,
                             "rlp-kit-a==1.0\nrlp-kit-b==1.0\nrlp-kit-image==2.0\n",
                             "rlp_kit_image==2.0\nrlp_kit_b==0.9\n", str(gguf), 64 * 2**10)
    assert status == 0
    assert [w["name"] for w in json.loads((kit / "wheels/manifest.json").read_text())
            ["wheels"]] == ["rlp-kit-a", "rlp-kit-b"]  # the image's marker stays out

    logs = tmp_path / "out"
    run = _run_smoke(kit, python, logs, STOP_AFTER="install")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    verdict = json.loads((logs / "verdict.json").read_text())
    assert verdict["verdict"] == "ok, stopped after install", verdict
    assert [s["stage"] for s in verdict["stages"]] == ["env", "install", "project", "model"]
    assert sorted(p.name for p in logs.iterdir()) == ["01-setup.log", "02-model.log",
                                                      "verdict.json"]
    setup = (logs / "01-setup.log").read_text()
    assert "a venv: True" in setup and "2 of 2 top-level modules" in setup
    assert "imported instead of the target's:\n  rlp-kit-b 1.0 (the target's: 0.9)" in setup
    # The image's own package and the kit's, together, on the image's python3; the project
    # from this repository's src/, first.
    shown = _in_kit_env(kit, python, "import rlp_kit_image, rlp_kit_a, rlp_kit_b, rl_pipeline; "
                        "print(rlp_kit_image.__file__, rlp_kit_a.__file__, rlp_kit_b.VERSION, "
                        "rl_pipeline.__file__)")
    assert shown.returncode == 0, shown.stderr
    image_file, kit_file, kit_b_version, project_file = shown.stdout.split()
    assert image_file.startswith(str(tmp_path / "image"))
    assert kit_file.startswith(str(kit / "site")) and kit_b_version == "1.0"
    assert project_file.startswith(str(PROJECT_ROOT / "src"))
    assert (kit / "model" / gguf.name).read_bytes() == gguf.read_bytes()

    # A model part lost on the way: the model stage names it, the install (in place) holds.
    parts = json.loads((kit / "model.json").read_text())["parts"]
    lost = kit / parts[1]["file"]
    lost.rename(tmp_path / lost.name)
    shutil.rmtree(kit / "model")
    run = _run_smoke(kit, python, logs, STOP_AFTER="install")
    verdict = json.loads((logs / "verdict.json").read_text())
    status = {s["stage"]: s["status"] for s in verdict["stages"]}
    assert run.returncode != 0 and status == {"env": "ok", "install": "ok", "project": "ok",
                                              "model": "failed"}, run.stdout[-3000:]
    assert f"missing: {lost.name}" in (logs / "02-model.log").read_text()
    assert "holds this wheelhouse already" in (logs / "01-setup.log").read_text()
    (tmp_path / lost.name).rename(lost)

    # A wheel part lost: the install names it and stops; the model is still joined.
    wheel_parts = json.loads((kit / "wheels/manifest.json").read_text())["parts"]
    assert len(wheel_parts) > 1
    lost = kit / "wheels" / wheel_parts[-1]["file"]
    lost.unlink()
    shutil.rmtree(kit / "site")
    run = _run_smoke(kit, python, logs, STOP_AFTER="install")
    verdict = json.loads((logs / "verdict.json").read_text())
    status = {s["stage"]: s["status"] for s in verdict["stages"]}
    assert run.returncode != 0 and status == {"env": "ok", "install": "failed",
                                              "project": "skipped", "model": "ok"}
    assert f"missing: {lost.name}" in (logs / "01-setup.log").read_text()
    assert (kit / "model" / gguf.name).read_bytes() == gguf.read_bytes()


@pytest.mark.slow  # two kedro runs
def test_run_smoke_runs_the_smoke_stages_from_the_uploaded_tree(
        tmp_path, monkeypatch, tiny_model_dir) -> None:
    import torch

    # The upload's working tree: what git tracks, and what it does not ignore.
    tree = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                           "--exclude-standard"], cwd=PROJECT_ROOT, capture_output=True,
                          check=True).stdout.decode().split("\0")
    repo = tmp_path / "repo"
    for name in filter(None, tree):
        src = PROJECT_ROOT / name
        if src.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / name)
    # The image: torch, kedro and the rest from this project's venv (a .pth), and a marker.
    marker = _wheel(tmp_path, "rlp_kit_image", "2.0")
    python = _image(tmp_path, marker, host_packages=True)
    torch_version = torch.__version__.split("+")[0]
    status, kit = _build_kit(tmp_path, monkeypatch,
                             f"rlp-kit-a==1.0\nrlp-kit-image==2.0\ntorch=={torch_version}\n",
                             f"rlp_kit_image==2.0\ntorch=={torch.__version__}\n",
                             str(tiny_model_dir), 256 * 2**10)
    assert status == 0
    logs = tmp_path / "out"
    run = _run_smoke(kit, python, logs, script=repo / "scripts/run_smoke.sh",
                     STOP_AFTER="preflight", STAGE_TIMEOUT="400")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    verdict = json.loads((logs / "verdict.json").read_text())
    assert verdict["verdict"] == "ok, stopped after preflight"
    assert [s["stage"] for s in verdict["stages"]] == ["env", "install", "project", "model",
                                                      "data_prep", "preflight"]
    setup = (logs / "01-setup.log").read_text()
    # the image's torch, not a copy of the kit's
    assert f"torch {torch.__version__} from {Path(torch.__file__).parent} (the target's own" \
        in setup
    assert f"rl_pipeline 0.1.0 from {repo / 'src'}" in setup
    for log in ("03-data_prep.log", "04-preflight.log"):
        assert "kedro" in (logs / log).read_text().lower()
    # conf/smoke's preflight passed on the kit's model, in the uploaded tree
    report = json.loads((repo / "data/08_reporting/preflight_report.json").read_text())
    assert report["engine"] == "verl" and report["host"]["plan"]["steps"] == 4
    carried = kit / "model" / tiny_model_dir.name
    assert sorted(p.name for p in carried.iterdir()) == sorted(
        p.name for p in tiny_model_dir.iterdir())
