"""Benchmark: does the default CPU run improve the model beyond noise, seed after seed?

Runs the whole default pipeline (``kedro run --env cpu``, what ``make run`` runs on a
machine without a GPU: data_prep, train, merge, eval) once per seed, each in a cold scratch
copy of the project (its own data folder, model conversion and MLflow store; the raw GSM8K
files and the GGUF model linked in). The seed is ``train.trl.seed`` (LoRA init, sampling,
shuffling) and ``eval.seed`` (the bootstrap). For each run it reads eval's metrics: the
headline mean reward of base and trained on the held-out prompts, the paired-bootstrap 95%
interval of the difference, and the strict format rate and strict accuracy beside it, and
the wall time and peak memory of the whole run.

Goal (issue 18): trained above base beyond the interval in every seed, each run within 15
minutes on 2 cores. Writes the table to docs/benchmarks.md; exits 1 when the goal is missed.

Usage: ``.venv/bin/python benchmarks/bench_cpu_run.py [--seeds 42 43 44] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench_data_prep import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## The default CPU run: does training help?"
LIMIT_S = 15 * 60


def scratch_project(root: Path) -> Path:
    """The project's configuration in ``root``, with the raw data linked in (read only)."""
    project = root / "project"
    project.mkdir()
    shutil.copy(ROOT / "pyproject.toml", project)
    # conf/local is this machine's: the benchmark measures the configuration as shipped.
    shutil.copytree(ROOT / "conf", project / "conf", ignore=shutil.ignore_patterns("local"))
    (project / "conf/local").mkdir()
    (project / "src").mkdir()  # the package itself is the installed one
    (project / "data").mkdir()
    (project / "data/01_raw").symlink_to(ROOT / "data/01_raw")
    return project


def run_once(seed: int, log_dir: Path) -> dict:
    """One whole default run with ``seed``: its eval metrics, wall time and peak memory."""
    with tempfile.TemporaryDirectory(prefix=f"cpu-run-{seed}-") as tmp:
        project = scratch_project(Path(tmp))
        log = log_dir / f"seed{seed}.log"
        command = [sys.executable, "-m", "kedro", "run", "--env", "cpu",
                   "--params", f"train.trl.seed={seed},eval.seed={seed}"]
        env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "true"}
        start = time.perf_counter()
        with log.open("w") as out:
            done = subprocess.run(command, cwd=project, stdout=out, stderr=subprocess.STDOUT,
                                  env=env)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"seed {seed}: kedro run failed ({done.returncode}); see {log}")
        metrics = json.loads((project / "data/08_reporting/eval_metrics.json").read_text())
    # Children's peak resident memory: the largest of the runs so far (Linux: KiB).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    base, trained = metrics["base"], metrics["trained"]
    return {"seed": seed, "base": base, "trained": trained,
            "delta": trained["vs_base"]["mean_reward"],
            "format": trained["vs_base"]["strict_format_rate"],
            "wall_s": wall, "peak_mib": peak}


def settings() -> str:
    """The levers of conf/cpu that the result depends on, in one line."""
    params = yaml.safe_load((ROOT / "conf/cpu/parameters.yml").read_text())
    trl, ev = params["train"]["trl"], params["eval"]
    return (f"reward `{params['reward']['custom_reward_function']['name']}`, instruction "
            f"`{params['data_prep']['instruction']}`, {params['data']['data_max_response_length']}"
            f" response tokens, {trl['max_steps']} GRPO steps of 2 prompts x 4 completions at "
            f"learning rate {trl['learning_rate']} (LoRA), eval on the first "
            f"{ev['max_prompts']} GSM8K test prompts, "
            f"{'greedy' if ev.get('greedy') else 'sampled'}")


def table(rows: list[dict]) -> str:
    lines = ["| seed | base mean reward | trained mean reward | delta [95% interval] | beyond "
             "noise | strict format rate base -> trained [interval of delta] | strict accuracy "
             "base -> trained | wall time (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, f = r["delta"], r["format"]
        lines.append(
            f"| {r['seed']} | {r['base']['mean_reward']:.3f} | {r['trained']['mean_reward']:.3f}"
            f" | {d['delta']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | "
            f"{'yes' if d['ci_low'] > 0 else 'no'} | {r['base']['strict_format_rate']:.3f} -> "
            f"{r['trained']['strict_format_rate']:.3f} [{f['ci_low']:+.3f}, {f['ci_high']:+.3f}]"
            f" | {r['base']['strict_accuracy']:.3f} -> {r['trained']['strict_accuracy']:.3f} | "
            f"{r['wall_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where each run's output goes (seed<N>.log)")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/")
    args = parser.parse_args()

    rows = []
    for seed in args.seeds:
        row = run_once(seed, args.log_dir)
        rows.append(row)
        d = row["delta"]
        print(f"seed {seed}: mean reward {row['base']['mean_reward']:.3f} -> "
              f"{row['trained']['mean_reward']:.3f}, delta {d['delta']:+.3f} "
              f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], {row['wall_s']:.0f} s", flush=True)
    met = all(r["delta"]["ci_low"] > 0 for r in rows)
    in_time = all(r["wall_s"] <= LIMIT_S for r in rows)
    text = "\n".join([
        SECTION, "",
        "`benchmarks/bench_cpu_run.py`: the whole default run (`kedro run --env cpu`, which "
        "`make run` runs without a GPU) once per seed, each in a cold scratch copy of the "
        "project (the GGUF converted afresh, its own MLflow store). The seed is "
        "`train.trl.seed` and `eval.seed`. Metric: the headline, the mean reward on the "
        "held-out prompts (GSM8K test); interval: eval's paired bootstrap over prompts (10,000 "
        "resamples).", "",
        f"Settings (conf/cpu/parameters.yml): {settings()}.", "",
        f"Machine: {machine()}. Peak memory of a run: {max(r['peak_mib'] for r in rows):,.0f} "
        "MiB.", "",
        table(rows), "",
        f"Goal: trained above base beyond the 95% interval in every seed, each whole run within "
        f"{LIMIT_S // 60} minutes: {'met' if met and in_time else 'NOT met'}.", ""])
    print(text)
    if not args.no_write:
        write_section(text, SECTION)
    if not (met and in_time):
        sys.exit(1)


if __name__ == "__main__":
    main()
