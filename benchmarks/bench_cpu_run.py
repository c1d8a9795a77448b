"""Benchmark: does the default CPU run make the model more often right, seed after seed?

Runs the whole default pipeline (``kedro run --env cpu``, what ``make run`` runs on a
machine without a GPU: data_prep, train, merge, eval) once per seed, each in a cold scratch
copy of the project (its own data folder, model conversion and MLflow store; the raw data
and the GGUF model linked in). The seed is ``train.trl.seed`` (LoRA init, sampling,
shuffling) and ``eval.seed`` (the bootstrap). For each run it reads eval's verdict and
metrics: correctness (strict and flexible accuracy) of base and trained on the held-out
prompts with the paired-bootstrap 95% interval of each difference, the degeneration rates
(truncation, repetition, no reasoning), the headline reward, a few trained answers from the
generations, and the wall time and peak memory of the whole run.

Goal (issue 24): eval's verdict "learned" (correctness up beyond its interval, no
degeneration rate up beyond its interval) in every seed, each run within 15 minutes on 2
cores. Writes the table to docs/benchmarks.md; exits 1 when the goal is missed.

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

import pandas as pd
import yaml

from bench_data_prep import machine, write_section
from rl_pipeline.evaluation.verdict import LEARNED

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## The default CPU run: does training help?"
LIMIT_S = 15 * 60
EXAMPLES = 5


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
        (generations,) = project.glob("data/07_model_output/eval_generations.parquet/*/*")
        answers = pd.read_parquet(generations)
    # Children's peak resident memory: the largest of the runs so far (Linux: KiB).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    base, trained = metrics["base"], metrics["trained"]
    trained_answers = answers[answers["model"] == "trained"].head(EXAMPLES)
    return {"seed": seed, "base": base, "trained": trained,
            "verdict": trained["verdict"], "wall_s": wall, "peak_mib": peak,
            "examples": [(r.prompt, r.ground_truth, r.response, r.reward)
                         for r in trained_answers.itertuples()]}


def settings() -> str:
    """The levers of conf/cpu that the result depends on, in one line."""
    params = yaml.safe_load((ROOT / "conf/cpu/parameters.yml").read_text())
    catalog = yaml.safe_load((ROOT / "conf/cpu/catalog.yml").read_text())
    trl, ev, prep = params["train"]["trl"], params["eval"], params["data_prep"]
    shots = len(prep.get("few_shot", []))
    reward = (params.get("reward") or {}).get("custom_reward_function", {}).get(
        "name", "compute_score")
    held_out = catalog["raw_val"]["rows"]
    prompts = (f"the first {ev['max_prompts']}" if ev.get("max_prompts") else "all")
    return (f"{catalog['raw_train']['rows']} generated additions to train on and "
            f"{held_out} held out, instruction `{prep['instruction']}` with "
            f"{shots} worked example{'s' if shots != 1 else ''} as an earlier chat turn, reward "
            f"`{reward}`, "
            f"{params['data']['data_max_response_length']} response tokens, {trl['max_steps']} "
            f"GRPO steps of 2 prompts x 4 completions at temperature {trl['temperature']} and "
            f"learning rate {trl['learning_rate']} (LoRA), eval on {prompts} {held_out} "
            f"held-out prompts, {'greedy' if ev.get('greedy') else 'sampled'}")


def _change(r: dict, metric: str) -> str:
    c = r["trained"]["vs_base"][metric]
    return (f"{r['base'][metric]:.3f} -> {r['trained'][metric]:.3f}, {c['delta']:+.3f} "
            f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]")


def table(rows: list[dict]) -> str:
    lines = ["| seed | verdict | strict accuracy, base -> trained, delta [95% interval] | "
             "flexible accuracy | truncation rate | repetition rate | no-reasoning rate | "
             "headline reward | wall time (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['verdict']['verdict']} | "
                     + " | ".join(_change(r, m) for m in (
                         "strict_accuracy", "flexible_accuracy", "truncation_rate",
                         "repetition_rate", "no_reasoning_rate", "mean_reward"))
                     + f" | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def examples(rows: list[dict]) -> list[str]:
    """The first trained answers of each seed, as eval's generations table has them."""
    lines = []
    for r in rows:
        lines += [f"Seed {r['seed']}, the first {len(r['examples'])} held-out prompts, trained "
                  "model (prompt -> answer, ground truth, reward):", ""]
        lines += [f"- {prompt.split('?')[0]}? -> `{response!r}` (truth {truth}, reward "
                  f"{reward:g})" for prompt, truth, response, reward in r["examples"]]
        lines.append("")
    return lines


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
        print(f"seed {seed}: {row['verdict']['verdict']}; strict accuracy "
              f"{_change(row, 'strict_accuracy')}; {row['wall_s']:.0f} s", flush=True)
    learned = all(r["verdict"]["verdict"] == LEARNED for r in rows)
    in_time = all(r["wall_s"] <= LIMIT_S for r in rows)
    text = "\n".join([
        SECTION, "",
        "`benchmarks/bench_cpu_run.py` (`make bench-cpu-run`): the whole default run (`kedro run "
        "--env cpu`, which `make run` runs without a GPU) once per seed, each in a cold scratch "
        "copy of the project (the GGUF converted afresh, its own MLflow store). The seed is "
        "`train.trl.seed` and `eval.seed`. Each cell: base -> trained on the held-out prompts, "
        "and the difference with eval's paired-bootstrap 95% interval (10,000 resamples). The "
        "verdict is eval's ([docs/rewards.md](rewards.md#the-eval-verdict)).", "",
        f"Settings (conf/cpu): {settings()}.", "",
        f"Machine: {machine()}. Peak memory of a run: {max(r['peak_mib'] for r in rows):,.0f} "
        "MiB.", "",
        table(rows), "",
        *examples(rows),
        f"Goal: verdict \"learned\" in every seed, each whole run within {LIMIT_S // 60} "
        f"minutes: {'met' if learned and in_time else 'NOT met'}.", ""])
    print(text)
    if not args.no_write:
        write_section(text, SECTION)
    if not (learned and in_time):
        sys.exit(1)


if __name__ == "__main__":
    main()
