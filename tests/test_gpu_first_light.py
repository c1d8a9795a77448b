"""scripts/gpu_first_light.py, the rungs a lent GPU box runs from one upload: on this CPU,
each rung in its own process, three files out, the verdict as the last line printed.

The rungs themselves (generation, TRL, verl, kedro) are run on this CPU with --device cpu
by hand (docs/gpu.md, "First light": about 6 minutes); here the orchestration is tested."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts/gpu_first_light.py"


def _first_light(tmp_path: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "fl"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--bundles", str(tmp_path / "none"),
         "--work", str(tmp_path / "work"), *args],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1], json.loads((out / "verdict.json").read_text())


def test_without_a_gpu_the_first_rung_fails_and_the_rest_say_why_they_did_not_run(
        tmp_path) -> None:
    line, verdict = _first_light(tmp_path, "--rungs", "a,c")  # a0 is added on cuda
    rungs = verdict["rungs"]
    assert rungs["a0"]["status"] == "FAIL"
    assert "no CUDA device seen by torch" in " ".join(rungs["a0"]["tail"])
    assert {rungs[r]["status"] for r in ("a", "c")} == {"skipped"}
    assert rungs["c"]["reason"] == "needs rung a0 (no GPU seen)"
    assert line.startswith("FIRST-LIGHT a0=FAIL(rc 1: RuntimeError: no CUDA device seen")
    assert "a=skipped c=skipped" in line
    assert sorted(p.name for p in (tmp_path / "fl").iterdir()) == [
        "env.txt", "rungs.log", "verdict.json"]  # what a lent box's output folder brings back
    assert "no CUDA device seen by torch" in (tmp_path / "fl/rungs.log").read_text()


def test_on_the_cpu_a_rung_runs_and_a_rung_without_its_inputs_is_skipped(tmp_path) -> None:
    line, verdict = _first_light(tmp_path, "--device", "cpu", "--rungs", "a0,c2")
    a0 = verdict["rungs"]["a0"]
    assert a0["status"] == "pass" and a0["tflops"] > 0 and a0["cuda_available"] is False
    assert verdict["rungs"]["c2"] == {**verdict["rungs"]["c2"], "status": "skipped",
                                      "reason": "needs the GGUF parts"}
    assert line.startswith("FIRST-LIGHT a0=pass c2=skipped")
    assert "torch" in (tmp_path / "fl/env.txt").read_text()


def test_on_the_cpu_the_vllm_rungs_say_they_need_cuda(tmp_path) -> None:
    line, verdict = _first_light(tmp_path, "--device", "cpu", "--site", "",
                                 "--rungs", "d,smoke-train,smoke-eval")
    assert {r["reason"] for r in verdict["rungs"].values()} == {"vLLM's kernels need CUDA"}
    assert line.startswith("FIRST-LIGHT d=skipped smoke-train=skipped smoke-eval=skipped")


def test_the_vllm_sets_units_that_have_arrived_are_unpacked_before_the_rungs(tmp_path) -> None:
    from tests.conftest import load_script

    vs, flb = load_script("vllm_set"), load_script("first_light_bundle")
    tree = tmp_path / "unit"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm/marker.py").write_text("VALUE = 1\n")
    flb.pack(tree, tmp_path / "packed/vllm-python.txz", use_xz=False)
    vs.stream_into_folders([{"unit": "vllm-python.txz",
                             "path": tmp_path / "packed/vllm-python.txz"}], tmp_path / "gpu")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "fl"), "--bundles",
         str(tmp_path / "gpu"), "--site", str(site), "--work", str(tmp_path / "work"),
         "--device", "cpu", "--rungs", "a0"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = json.loads((tmp_path / "fl/verdict.json").read_text())
    assert verdict["unpacked"] == []  # the first light's unpacking leaves the set alone
    assert verdict["vllm_set"]["unpacked"] == ["vllm-python.txz"]
    assert (site / "vllm/marker.py").read_text() == "VALUE = 1\n"


def test_a_rung_past_the_budget_is_stopped_its_output_kept_and_the_rest_skipped(
        tmp_path) -> None:
    # The box kills the whole call at its limit; the first GPU call lost a rung that way
    # (its output was piped and written only at its end). With --budget-s the script stops
    # the rung itself, and the log shows how far it got.
    line, verdict = _first_light(tmp_path, "--device", "cpu", "--site", "",
                                 "--rungs", "a0,c,e", "--budget-s", "45")
    rungs = verdict["rungs"]
    assert rungs["a0"]["status"] == "pass"
    assert rungs["c"]["status"] == "FAIL" and rungs["c"]["rc"] == "timeout"
    assert rungs["c"]["limit_s"] < 45
    assert rungs["e"] == {**rungs["e"], "status": "skipped", "reason": "--budget-s 45.0 spent"}
    log = (tmp_path / "fl/rungs.log").read_text()
    assert "===== rung c:" in log and "ray init kwargs" in log.split("===== rung c:")[1]
    assert verdict["seconds"] < 45
    assert line.startswith("FIRST-LIGHT a0=pass c=FAIL(rc timeout")
