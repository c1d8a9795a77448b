"""Benchmark: the whole pipeline with verl's own trainer on this CPU (train.verl.device=cpu).

Runs ``kedro run --env cpu --params train.engine=verl`` (data_prep, verl train, merge, eval:
what ``make run ARGS="--params train.engine=verl"`` runs) in a cold scratch copy of the
project, samples the resident memory of the whole process tree (the Kedro driver, Ray and
every verl actor, summed) twice a second, and reads verl's per-step metrics back from the
train stage's MLflow run. Writes the section to docs/benchmarks.md.

Usage: ``.venv/bin/python benchmarks/bench_verl_cpu.py [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import psutil

from bench_cpu_run import scratch_project
from bench_data_prep import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## verl's own trainer on a CPU"
STEP_METRICS = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "critic/score/mean",
                "training/rollout_actor_probs_pearson_corr")


class TreeMemory(threading.Thread):
    """The largest summed RSS of a process and all its descendants, sampled."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root, self.peak, self.done = psutil.Process(pid), 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                tree = [self.root, *self.root.children(recursive=True)]
                total = 0
                for process in tree:
                    try:
                        total += process.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                return
            time.sleep(0.5)


def run(log: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="verl-cpu-") as tmp:
        project = scratch_project(Path(tmp))
        started = time.perf_counter()
        with open(log, "w") as out:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "kedro"), "run", "--env", "cpu",
                 "--params", "train.engine=verl"], cwd=project, stdout=out,
                stderr=subprocess.STDOUT)
            memory = TreeMemory(process.pid)
            memory.start()
            rc = process.wait()
            memory.done.set()
        seconds = time.perf_counter() - started
        if rc:
            raise SystemExit(f"kedro run failed (rc {rc}); see {log}")
        reports = project / "data/08_reporting"
        summary = json.loads((reports / "train_summary.json").read_text())
        metrics = json.loads((reports / "eval_metrics.json").read_text())
        verdict = metrics["trained"].get("verdict", {}).get("verdict")
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{project}/mlflow.db")
        client = mlflow.MlflowClient()
        steps: dict[int, dict[str, float]] = {}
        for key in STEP_METRICS:
            for m in client.get_metric_history(summary["mlflow_run_id"], key):
                steps.setdefault(m.step, {})[key] = m.value
        merge = json.loads((reports / "merge_metadata.json").read_text())
        (table,) = project.glob("data/07_model_output/eval_generations.parquet/*/*.parquet")
        scored = pd.read_parquet(table)  # one row per model and sample
        keys = ["prompt_index", "sample_index"]
        side_by_side = scored[scored.model == "base"].merge(
            scored[scored.model == "trained"].drop(columns=["prompt", "ground_truth"]),
            on=keys, suffixes=("_base", "_trained"))
        gains = strict_gains(side_by_side)
        return {"seconds": seconds, "peak_gib": memory.peak / 2**30, "steps": steps,
                "train_seconds": summary["seconds"], "verdict": verdict,
                "merge_passed": merge["verification"]["passed"],
                "rollout_policy": summary.get("rollout_policy", {}),
                "gains": gains,
                **{key: (metrics["base"].get(key), metrics["trained"].get(key))
                   for key in ("strict_accuracy", "flexible_accuracy", "strict_format_rate")}}


def strict_gains(table: pd.DataFrame) -> dict:
    """Where strict accuracy moved, prompt by prompt (``table``: eval's scored generations,
    base and trained side by side, columns suffixed ``_base`` and ``_trained``): a gain
    whose base answer already ended in the right number (flexible right) is the '#### n'
    format learned; one whose base number was wrong is a sum the trained model got right.
    Three quoted examples of each."""
    up = table[(table.strict_base == 0) & (table.strict_trained == 1)]
    down = table[(table.strict_base == 1) & (table.strict_trained == 0)]
    kinds = {"format": up[up.flexible_base == 1], "sum": up[up.flexible_base == 0],
             "lost": down}

    def question(prompt) -> str:
        last = prompt[-1]["content"] if not isinstance(prompt, str) else prompt
        return last.split("?")[0] + "?"

    def quote(rows: pd.DataFrame) -> list[str]:
        return [f"{question(r.prompt)} (truth {r.ground_truth}): base "
                f"`{r.response_base!r}` -> trained `{r.response_trained!r}`"
                for r in rows.head(3).itertuples()]

    return {k: {"count": len(v), "examples": quote(v)} for k, v in kinds.items()}


def section(r: dict) -> str:
    rows = ["| step | step time (s) | rollout (s) | actor update (s) | mean reward | "
            "rollout-actor pearson |", "|---|---|---|---|---|---|"]
    for step, m in sorted(r["steps"].items()):
        rows.append(f"| {step} | {m.get('timing_s/step', 0):.1f} | {m.get('timing_s/gen', 0):.1f}"
                    f" | {m.get('timing_s/update_actor', 0):.1f} | "
                    f"{m.get('critic/score/mean', 0):.3f} | "
                    f"{m.get('training/rollout_actor_probs_pearson_corr', 0):.4f} |")
    (base, trained), (flex_base, flex_trained), (form_base, form_trained) = (
        r["strict_accuracy"], r["flexible_accuracy"], r["strict_format_rate"])
    # Strict accuracy needs the '#### n' form, flexible only the right last number: a strict
    # gain that flexible accuracy does not share is the format learned, not the sums.
    format_only = (trained - base) > 2 * max(flex_trained - flex_base, 0.0)
    return "\n".join([
        SECTION, "",
        f"`benchmarks/bench_verl_cpu.py` on {machine()}: `kedro run --env cpu --params "
        "train.engine=verl` from a cold copy (data_prep, verl's `run_ppo` with the CPU "
        "platform and the transformers rollout, merge of verl's checkpoint, eval). "
        "SmolLM2-135M-Instruct, one gloo rank, 2 prompts x 4 completions of at most 48 "
        "tokens, LoRA rank 16, GRPO, 4 steps (docs/gpu.md, 'verl on a CPU').", "",
        f"- whole run: {r['seconds'] / 60:.1f} min, of which verl's training "
        f"{r['train_seconds']:.0f} s (Ray start-up and actor set-up included)",
        f"- peak memory of the whole process tree (driver, Ray, every verl actor, summed): "
        f"{r['peak_gib']:.1f} GiB (resident sets summed: torch's shared libraries count once "
        "per process, so the machine needs less)",
        f"- merge of verl's checkpoint verified: {r['merge_passed']}; rollout-policy check: "
        f"{r['rollout_policy']}",
        f"- eval: verdict {r['verdict']}, strict accuracy {base} -> {trained}, flexible "
        f"accuracy (the right last number, any form) {flex_base} -> {flex_trained}, strict "
        f"format rate (a '#### n' answer) {form_base} -> {form_trained}. "
        + ("Most of the strict gain is the answer format adopted, not sums got right: the "
           "verdict's 'learned' is the format. " if format_only else "")
        + "Four steps with 8 samples each are a check of the path, not a training run: "
        "read the verdict as one measurement of one run.",
        f"- where strict accuracy moved (prompt by prompt): {r['gains']['format']['count']} "
        "gains are the format only (the base answer already ended in the right number, the "
        f"trained one adds '#### n'), {r['gains']['sum']['count']} are sums the base got "
        f"wrong and the trained model right, {r['gains']['lost']['count']} were lost:",
        *[f"  - {kind}: {example}" for kind in ("format", "sum", "lost")
          for example in r["gains"][kind]["examples"]], "", *rows, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    log = Path(tempfile.gettempdir()) / "bench_verl_cpu.log"
    result = run(log)
    text = section(result)
    print(text)
    if not args.no_write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
