"""`make gpu-kit` (scripts/gpu_kit.py): the wheels a GPU image lacks, a model and the project,
every file within the part size, and run_smoke.sh installing them on a box with no index.

The package index is stood in for by local wheels (wheelhouse.fetch_one, its one network
call); the model is the tiny test model; the project is this checkout's HEAD."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow
SCRIPTS = PROJECT_ROOT / "scripts"


def _load(name: str):
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


def test_the_kit_holds_what_the_image_lacks_in_small_parts_and_installs_offline(
        tmp_path, monkeypatch, tiny_model_dir) -> None:
    gpu_kit = _load("gpu_kit")
    wheelhouse = gpu_kit.wheelhouse
    made = tmp_path / "index"
    made.mkdir()
    wheels = {name: _wheel(made, name, "1.0") for name in ("rlp_kit_a", "rlp_kit_b")}
    lock = tmp_path / "gpu.lock"
    lock.write_text("rlp-kit-a==1.0\nrlp-kit-b==1.0\nrlp-kit-image==2.0\n")
    freeze = tmp_path / "image.freeze"  # the image has one locked package already
    freeze.write_text("rlp_kit_image==2.0\ntorch==2.11.0+cu130\n")

    def from_local_index(name, version, stage, python_version, platforms):
        dest = stage / name
        dest.mkdir(parents=True, exist_ok=True)
        src = wheels[name.replace("-", "_")]
        (dest / src.name).write_bytes(src.read_bytes())
        return wheelhouse.Wheel(name, version, dest / src.name, "downloaded")

    monkeypatch.setattr(wheelhouse, "fetch_one", from_local_index)
    out = tmp_path / "kit"
    part = 256 * 2**10
    assert gpu_kit.main(["--freeze", str(freeze), "--out", str(out), "--lock", str(lock),
                         "--model", str(tiny_model_dir), "--part-size", str(part)]) == 0

    summary = json.loads((out / "kit.json").read_text())
    files = [p for p in out.rglob("*") if p.is_file()]
    assert summary["files"] == len(files) and summary["bytes"] <= sum(
        p.stat().st_size for p in files)
    assert max(p.stat().st_size for p in files) <= part  # every file fits one transfer
    assert summary["wheels"] == 2 and summary["parts"] == len(
        [p for p in files if ".tar.part-" in p.name]) > 3
    assert subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=out).returncode == 0

    # The box: no index. Its image is stood in for by this checkout's environment (torch,
    # transformers, setuptools, ...: a .pth in a venv of the base interpreter, as
    # run_smoke.sh's --system-site-packages sees an image's), minus the locked packages the
    # kit carries; it has the one the freeze says it has.
    box = out / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(box)],
                   check=True)  # pip and setuptools: the image's
    site = next(box.glob("lib/python3.*/site-packages"))
    (site / "image.pth").write_text("\n".join(p for p in sys.path if "site-packages" in p))
    # The box sees only its own environment, not a PYTHONPATH of this session.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PIP_NO_INDEX": "1",
           "STOP_AFTER": "preflight"}
    subprocess.run([str(box / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    str(_wheel(made, "rlp_kit_image", "2.0"))], check=True, env=env)
    run = subprocess.run(["bash", str(out / "run_smoke.sh")], capture_output=True, text=True,
                         env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "every file of the kit checked" in run.stdout
    shown = subprocess.run([str(box / "bin/python"), "-c",
                            "import rlp_kit_a, rl_pipeline, pathlib; "
                            "print(rlp_kit_a.VERSION, pathlib.Path(rl_pipeline.__file__))"],
                           capture_output=True, text=True, check=True, env=env).stdout.split()
    assert shown[0] == "1.0" and shown[1].startswith(str(out / "work/rl_pipeline/src"))
    # conf/smoke's preflight passed on the kit's model, in the kit's copy of the project.
    report = json.loads((out / "work/rl_pipeline/data/08_reporting/preflight_report.json")
                        .read_text())
    assert report["engine"] == "verl" and report["host"]["plan"]["steps"] == 4
    # The project is HEAD; the model the tiny one, in bf16.
    head = subprocess.run(["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
    assert (out / "work/rl_pipeline" / head[0]).is_file()
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    carried = AutoModelForCausalLM.from_pretrained(out / "work/model").state_dict()
    assert {t.dtype for t in carried.values()} == {torch.bfloat16}
    assert all(torch.equal(carried[k], original[k].to(torch.bfloat16)) for k in original)

    # A part lost on the way: nothing is installed, the file is named.
    lost = next(out.glob("model.tar.part-*"))
    lost.unlink()
    failed = subprocess.run(["bash", str(out / "run_smoke.sh")], capture_output=True,
                            text=True, env=env, timeout=600)
    assert "every file of the kit checked" not in failed.stdout
    assert failed.returncode != 0 and lost.name in failed.stdout + failed.stderr
