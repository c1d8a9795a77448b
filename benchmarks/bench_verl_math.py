"""Benchmark: verl on a CPU with MATH-style answers, scored by the MATH scorer (math-verify)
where verl calls it: on an executor thread of its reward loop, in a Ray actor.

The default CPU run (conf/cpu) with its additions answered in MATH's form, ``a + b =
\\boxed{s}``: data_source ``math`` (so ``compute_score`` picks math-verify), the worked example
and the instruction asking for ``\\boxed{}``, the ground truth read out of the box. Everything
else is conf/cpu's verl run. Until the reward's time limit moved into worker processes, this
run scored every sample 0 (math-verify's SIGALRM raised off the main thread, and the reward
self-test refused the data first).

Writes the per-step reward curve (verl's ``critic/score/mean``, with the reward errors and
timeouts per step) to docs/images/verl_math_reward.png and a section to docs/benchmarks.md.

Usage: ``.venv/bin/python benchmarks/bench_verl_math.py [--seed 42] [--keep DIR] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

from bench_cpu_run import scratch_project, step_metrics
from bench_data_prep import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## verl on MATH-style answers"
IMAGE = ROOT / "docs/images/verl_math_reward.png"
DATA_PREP = {
    "data_source": "math",
    "instruction": "Solve it briefly, then put the final answer in \\boxed{}.",
    "few_shot": [{"question": "What is 7 + 25?", "answer": "7 + 25 = \\boxed{32}"}],
    "answer_extraction": "regex",
    "answer_regex": "\\\\boxed\\{(\\d+)\\}",
}


def math_project(root: Path) -> Path:
    """A scratch project whose conf/cpu asks for and scores ``\\boxed{}`` answers."""
    project = scratch_project(root)
    params_file = project / "conf/cpu/parameters.yml"
    params = yaml.safe_load(params_file.read_text())
    params["data_prep"] = {**params["data_prep"], **DATA_PREP}
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    catalog_file = project / "conf/cpu/catalog.yml"
    catalog = yaml.safe_load(catalog_file.read_text())
    for entry in ("raw_train", "raw_val"):
        catalog[entry]["answer_format"] = "boxed"
    catalog_file.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return project


def plot(steps: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score = steps["critic/score/mean"]
    x = range(1, len(score) + 1)
    window = 5
    smooth = pd.Series(score).rolling(window, min_periods=1).mean()
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=120)
    ax.plot(x, score, ".", color="#999999", label="mean reward of the step's 8 samples")
    ax.plot(x, smooth, "-", color="#1f77b4", label=f"mean of the last {window} steps")
    errors = [e + t for e, t in zip(steps.get("rollouts/reward_error/mean", [0] * len(score)),
                                    steps.get("rollouts/reward_timeout/mean", [0] * len(score)),
                                    strict=True)]
    ax.plot(x, errors, "x", color="#d62728", label="share of samples the scorer failed on")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward (math-verify)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("verl on a CPU, MATH-style answers (\\boxed{}): reward per step")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the scratch project (its MLflow store) under this")
    parser.add_argument("--params", default="", help="more --params for the run")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="verl-math-", dir=args.keep))
    log = Path(tempfile.gettempdir()) / "bench_verl_math.log"
    try:
        project = math_project(root)
        params = f"train.engine=verl,train.verl.seed={args.seed},eval.seed={args.seed}"
        params += f",{args.params}" if args.params else ""
        started = time.perf_counter()
        with log.open("w") as out:
            rc = subprocess.run([sys.executable, "-m", "kedro", "run", "--env", "cpu",
                                 "--params", params], cwd=project, stdout=out,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "true"}).returncode
        wall = time.perf_counter() - started
        if rc:
            sys.exit(f"kedro run failed ({rc}); see {log}")
        reports = project / "data/08_reporting"
        metrics = json.loads((reports / "eval_metrics.json").read_text())
        summary = json.loads((reports / "train_summary.json").read_text())
        prep = json.loads((reports / "data_prep_report.json").read_text()) \
            if (reports / "data_prep_report.json").exists() else {}
        steps = step_metrics(project, summary["mlflow_run_id"])
        (table,) = project.glob("data/07_model_output/eval_generations.parquet/*/*.parquet")
        scored = pd.read_parquet(table)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    base, trained = metrics["base"], metrics["trained"]
    compared = trained["vs_base"]["pass_at_1"]
    score = steps["critic/score/mean"]
    failures = sum(steps.get("rollouts/reward_error/mean", [])) + \
        sum(steps.get("rollouts/reward_timeout/mean", []))
    pairs = scored[scored.model == "base"].merge(
        scored[scored.model == "trained"][["prompt_index", "response", "reward"]],
        on="prompt_index", suffixes=("_base", "_trained")).head(5)
    self_test = prep.get("reward_self_test", {}).get("math", {})
    if not args.no_write:
        plot(steps, IMAGE)
    text = "\n".join([
        SECTION, "",
        "`benchmarks/bench_verl_math.py`: conf/cpu's verl run with the additions answered "
        "in MATH's form (`57 + 26 = \\boxed{83}`): `data_prep.data_source: math` (so "
        "`compute_score` picks math-verify), the worked example and the instruction ask for "
        "`\\boxed{}`, the ground truth is read out of the box. verl's reward loop calls the "
        "scorer on an executor thread of a Ray actor; it runs in a worker process there, "
        "within `reward.timeout_s` (docs/rewards.md).", "",
        f"Machine: {machine()}. Whole run (data_prep, train, merge, eval, promote): "
        f"{wall / 60:.1f} min.", "",
        f"- reward self-test in data_prep: {self_test.get('scorer', '?')}: golds scored "
        f"correct on {self_test.get('gold_correct', float('nan')):.0%} of "
        f"{self_test.get('rows', '?')} rows",
        f"- training reward per step (verl's `critic/score/mean`), {len(score)} steps: mean "
        f"{sum(score[:10]) / max(len(score[:10]), 1):.3f} over steps 1-10, "
        f"{sum(score[-10:]) / max(len(score[-10:]), 1):.3f} over the last 10; steps with a "
        f"non-zero reward: {sum(s > 0 for s in score)} of {len(score)}; samples the scorer "
        f"failed on (errors and timeouts): {failures:g}",
        f"- eval, greedy, {trained['prompts']} held-out prompts: correct (pass@1, math-verify) "
        f"{base['pass_at_1']:.3f} -> {trained['pass_at_1']:.3f}, {compared['delta']:+.3f} "
        f"[{compared['ci_low']:+.3f}, {compared['ci_high']:+.3f}]; verdict "
        f"**{trained['verdict']['verdict']}**", "",
        "![verl's reward per step on MATH-style answers](images/verl_math_reward.png)", "",
        "The first five held-out prompts, base -> trained:", "",
        *[f"- {r.prompt.split('?')[0]}? (truth {r.ground_truth}): `{r.response_base!r}` -> "
          f"`{r.response_trained!r}`" for r in pairs.itertuples()], ""])
    print(text)
    if not args.no_write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
