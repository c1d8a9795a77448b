"""requirements/gpu.lock matches pyproject.toml (scripts/gpu_lock.py --check).

The check resolves the GPU stack again with uv from package metadata only: it needs the
package index, but downloads no wheel (no CUDA wheels on a CPU machine or in CI).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_lock.py"
LOCK = REPO / "requirements" / "gpu.lock"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_lock", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_lock = _load_script()

needs_uv = pytest.mark.skipif(
    gpu_lock.find_uv() is None,
    reason="uv is not installed (it comes with the dev extra: pip install -e '.[dev]')",
)


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *args],
        capture_output=True, text=True, timeout=300,
    )


def _project_copy(tmp_path: Path, old: str, new: str) -> Path:
    """pyproject.toml and the lock in tmp_path, with one dependency line changed."""
    text = (REPO / "pyproject.toml").read_text()
    assert text.count(old) == 1, f"{old!r} is not once in pyproject.toml"
    (tmp_path / "pyproject.toml").write_text(text.replace(old, new))
    (tmp_path / "requirements").mkdir()
    shutil.copyfile(LOCK, tmp_path / "requirements" / "gpu.lock")
    return tmp_path


@pytest.mark.slow
@needs_uv
def test_the_lock_matches_pyproject():
    proc = _check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches pyproject.toml" in proc.stdout


@needs_uv
def test_the_check_fails_when_our_pins_conflict_with_verl_vllm(tmp_path):
    # verl[vllm] 0.9.1 pins transformers==5.9.0
    project = _project_copy(tmp_path, '"transformers>=5.5.3,!=5.6.0,<5.11"',
                            '"transformers>=5.10,<5.11"')
    proc = _check("--project", str(project))
    assert proc.returncode != 0
    # uv's own explanation of the conflict reaches the user
    assert "No solution found" in proc.stderr, proc.stderr
    assert re.search(r"verl\[vllm\].*depends on transformers==5\.9\.0", proc.stderr), proc.stderr
    assert "transformers>=5.10" in proc.stderr


@pytest.mark.slow
@needs_uv
def test_the_check_fails_when_the_lock_is_stale(tmp_path):
    project = _project_copy(tmp_path, '"math-verify>=0.7"', '"math-verify==0.8.0"')
    proc = _check("--project", str(project),
                  "--lock", str(project / "requirements" / "gpu.lock"))
    assert proc.returncode == 1
    assert "no longer matches" in proc.stderr
    assert re.search(r"math-verify: \S+ -> 0\.8\.0", proc.stderr), proc.stderr


def test_the_committed_lock_pins_the_gpu_stack():
    text = LOCK.read_text()
    pins = gpu_lock.parse_lock(text)
    assert gpu_lock.problems_in(pins, "lock") == []
    assert "rl-pipeline" not in pins
    # nothing machine-local, no index host, no hashes (it is used as a pip constraints file)
    gpu_lock.assert_portable(text, "lock")
    assert "--hash" not in text and "://" not in text


def test_lock_parsing_normalises_names_and_the_pin_rules():
    pins = gpu_lock.parse_lock(
        "# header\nHuggingface_Hub==1.0 \\\n    --hash=sha256:00\n"
        "ray[default]==2.60.0\n    # via rl-pipeline (pyproject.toml)\n"
        "torch==2.11.0+cpu ; sys_platform == 'linux'\n"
    )
    assert pins == {"huggingface-hub": "1.0", "ray": "2.60.0", "torch": "2.11.0+cpu"}
    problems = "\n".join(gpu_lock.problems_in(pins, "lock"))
    assert "torch==2.11.0+cpu instead of torch==2.11.0" in problems
    assert "no vllm" in problems and "no mlflow" in problems
    assert "local builds: torch==2.11.0+cpu" in problems
    with pytest.raises(SystemExit, match="machine-local path"):
        gpu_lock.assert_portable("foo @ file:///opt/wheels/foo.whl\n", "lock")


# scripts/wheelhouse.py and scripts/install_wheelhouse.sh, offline: the downloads are faked.

WHEELHOUSE = REPO / "scripts" / "wheelhouse.py"
INSTALLER = REPO / "scripts" / "install_wheelhouse.sh"


def _load_wheelhouse():
    spec = importlib.util.spec_from_file_location("rl_pipeline_wheelhouse_script", WHEELHOUSE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


wheelhouse = _load_wheelhouse()


def test_wheelhouse_platform_means_that_glibc_or_newer():
    tags = wheelhouse.platform_tags("manylinux_2_35_x86_64")
    assert tags[0] == "manylinux_2_35_x86_64"
    assert "manylinux_2_36_x86_64" not in tags
    for tag in ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64",
                "manylinux_2_17_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"):
        assert tag in tags
    assert wheelhouse.parse_size("60M") == 60 * 2**20
    assert wheelhouse.parse_size("1.5G") == int(1.5 * 2**30)


def test_wheelhouse_leaves_out_what_the_target_has(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "Huggingface_Hub==1.33.0\ntorch==2.11.0+cu130\ntransformers==5.17.0\n"
        "six @ file:///wheels/six-1.17.0-py2.py3-none-any.whl\n"
        "mystery @ git+https://example.invalid/mystery\n# comment\n"
    )
    have = wheelhouse.read_freeze(freeze)
    assert have["huggingface-hub"] == "1.33.0" and have["six"] == "1.17.0"
    pins = {"huggingface-hub": "1.33.0", "torch": "2.11.0", "transformers": "5.9.0",
            "six": "1.17.0", "vllm": "0.24.0", "mystery": "1.0"}
    fetch, present, notes = wheelhouse.split_by_target(pins, have)
    assert set(present) == {"huggingface-hub", "torch", "six"}
    assert set(fetch) == {"transformers", "vllm", "mystery"}
    assert any("transformers: the target has 5.17.0" in n for n in notes)


def _fake_wheel(folder: Path, name: str, version: str, payload: bytes) -> Path:
    """A pure-Python wheel `name` (an importable package) that pip installs."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": payload,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")

    record = [f"{k},sha256={digest(v)},{len(v)}" for k, v in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


@pytest.mark.slow
def test_wheelhouse_parts_install_offline_and_a_missing_part_is_refused(tmp_path, monkeypatch):
    made = tmp_path / "made"
    made.mkdir()
    rng = random.Random(0)
    for name in ("rlp_fake_a", "rlp_fake_b"):  # random payloads: zip cannot shrink them
        payload = b"# " + rng.randbytes(12000).hex().encode() + b"\n"
        _fake_wheel(made, name, "1.0", payload)
    base = _fake_wheel(made, "rlp_fake_base", "2.0", b"")  # what the target image has
    lock = tmp_path / "gpu.lock"
    lock.write_text("rlp-fake-a==1.0\n    # via test\nrlp-fake-b==1.0\nrlp-fake-base==2.0\n")
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("rlp_fake_base==2.0\n")

    def fake_fetch(name, version, stage, python_version, platforms):
        dest = stage / name
        dest.mkdir(parents=True, exist_ok=True)
        src = made / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        shutil.copyfile(src, dest / src.name)
        return wheelhouse.Wheel(name, version, dest / src.name, "downloaded")

    monkeypatch.setattr(wheelhouse, "fetch_one", fake_fetch)
    out = tmp_path / "out"
    rc = wheelhouse.main(["--lock", str(lock), "--python-version", "3.12",
                          "--platform", "manylinux_2_35_x86_64", "--exclude-freeze", str(freeze),
                          "--part-size", "16K", "--out", str(out)])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [w["name"] for w in manifest["wheels"]] == ["rlp-fake-a", "rlp-fake-b"]
    assert manifest["on_target"] == [{"name": "rlp-fake-base", "version": "2.0", "locked": "2.0"}]
    parts = sorted(out.glob("wheelhouse.tar.part-*"))
    assert len(parts) == len(manifest["parts"]) > 1
    assert all(p.stat().st_size <= 16 * 2**10 for p in parts)
    joined = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == manifest["tar"]["sha256"]
    assert not (out / ".wheels").exists()

    # The target: a fresh virtual environment holding rlp_fake_base; --no-index throughout.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # The target sees only its own venv: a PYTHONPATH of this test session (another test's
    # vLLM parser path, say) would show the host's packages to its pip check.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHON": str(py)}
    install = ["bash", str(out / "install_wheelhouse.sh"), str(out)]

    proc = subprocess.run(install, capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert "rlp-fake-base==2.0 (target has none)" in proc.stderr, proc.stderr

    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(base)],
                   check=True)
    moved = parts[-1].rename(tmp_path / parts[-1].name)
    proc = subprocess.run(install, capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert f"missing: {parts[-1].name}" in proc.stderr, proc.stderr
    moved.rename(parts[-1])

    proc = subprocess.run(install, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pip check: no broken requirements" in proc.stdout
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, check=True).stdout
    installed = {gpu_lock.normalize(d["name"]): d["version"] for d in json.loads(listed)}
    assert installed["rlp-fake-a"] == installed["rlp-fake-b"] == "1.0"
