"""Benchmark: does verl on two gloo ranks train as it does on one?

Runs the whole CPU run with the verl engine (``kedro run --env cpu --params
train.engine=verl,...``: data_prep, train, merge, eval, promote) twice with the same seed and
data, in cold scratch projects (``bench_cpu_run.run_once``): on one rank, and on two
(``trainer_n_gpus_per_node: 2``: FSDP2 shards the actor over two gloo ranks; one rollout
server serves both, ``rollout_tensor_model_parallel_size: 2``, so that both runs sample
alike). LoRA dropout is off in both: each rank draws its own dropout masks for its half of
the batch, so with it the two runs are two random draws of the same algorithm rather than
one computation summed in two ways.

For each step it reads both train runs' MLflow metrics: the mean score and response length
(the same responses, if the rollout sampled alike), the policy loss, grad norm and entropy
(the same mathematics, up to the order of float32 sums). From the first step whose responses
differ (a token drawn differently once the weights differ in their last bits), the runs are
two samples of one process and only their course can be compared. Then eval's verdict and
accuracy of both, and how many held-out prompts both trained models answered alike.

Goal (issue 37): every step before the responses diverge within a relative 1e-4 (the
tolerance of tests/engines/verl/test_cpu.py, which says why), the same verdict. Writes a
section of docs/benchmarks.md; exits 1 when the goal is missed.

Usage: ``.venv/bin/python benchmarks/bench_ranks.py [--steps 12] [--seed 42] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench_cpu_run import run_once
from bench_data_prep import machine, write_section

SECTION = "## Two ranks against one (verl on a CPU)"
RTOL = 1e-4
# The policy loss of an on-policy GRPO step is zero up to rounding (the advantages of a group
# sum to zero, every ratio is 1): there only an absolute difference means anything.
ATOL = 1e-6
SAME_SAMPLES = ("critic/score/mean", "response_length/mean")
SAME_MATHEMATICS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy")
TWO_RANKS = ("train.verl.trainer_n_gpus_per_node=2,"
             "train.verl.rollout_tensor_model_parallel_size=2,"
             # 8 responses a step: 4 on each rank, one micro-batch each.
             "train.verl.actor_ppo_micro_batch_size_per_gpu=4,"
             "train.verl.rollout_log_prob_micro_batch_size_per_gpu=4")


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def judged(a: float, b: float) -> float:
    """The relative difference, or 0 where both values are zero up to rounding (within
    ATOL of it)."""
    return 0.0 if max(abs(a), abs(b)) <= ATOL else relative(a, b)


def compare(one: dict[str, list[float]], two: dict[str, list[float]]) -> dict:
    """Step by step: the first step whose responses differ, and the largest relative
    difference of each metric before it."""
    steps = len(one["critic/score/mean"])
    diverged = next((s for s in range(steps) if any(
        relative(one[k][s], two[k][s]) > 1e-6 for k in SAME_SAMPLES)), None)
    alike = range(steps if diverged is None else diverged)
    worst = {k: max((judged(one[k][s], two[k][s]) for s in alike), default=0.0)
             for k in SAME_MATHEMATICS}
    return {"steps": steps, "diverged_at": None if diverged is None else diverged + 1,
            "worst": worst, "met": all(v <= RTOL for v in worst.values())}


def step_lines(one: dict[str, list[float]], two: dict[str, list[float]]) -> list[str]:
    lines = ["| step | score, 1 rank / 2 | response length, 1 / 2 | policy loss, 1 / 2 "
             "(relative difference) | grad norm, 1 / 2 (relative difference) | step time "
             "(s), 1 / 2 |", "|---|---|---|---|---|---|"]

    def pair(key: str, s: int, digits: int, diff: bool = False) -> str:
        text = f"{one[key][s]:.{digits}f} / {two[key][s]:.{digits}f}"
        return text + (f" ({relative(one[key][s], two[key][s]):.1e})" if diff else "")

    for s in range(len(one["critic/score/mean"])):
        lines.append(f"| {s + 1} | {pair('critic/score/mean', s, 3)} | "
                     f"{pair('response_length/mean', s, 2)} | "
                     f"{pair('actor/pg_loss', s, 6, True)} | "
                     f"{pair('actor/grad_norm', s, 6, True)} | {pair('timing_s/step', s, 1)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--results", type=Path, default=None,
                        help="also write the measurements as JSON here")
    parser.add_argument("--from-results", type=Path, default=None,
                        help="write the section from a --results file instead of running")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/")
    args = parser.parse_args()

    common = (f"train.verl.total_training_steps={args.steps},"
              f"train.verl.trainer_save_freq={args.steps},"
              "train.verl.actor_model_lora_dropout=0.0")
    rows = ({int(k): v for k, v in json.loads(args.from_results.read_text()).items()}
            if args.from_results else {})
    for ranks, extra in () if rows else ((1, common), (2, f"{common},{TWO_RANKS}")):
        log_dir = args.log_dir / f"ranks{ranks}"
        log_dir.mkdir(parents=True, exist_ok=True)
        rows[ranks] = run_once("verl", args.seed, log_dir, None, extra)
        print(f"{ranks} rank(s): {rows[ranks]['verdict']['verdict']}, "
              f"{rows[ranks]['wall_s']:.0f} s", flush=True)
    if args.results:
        args.results.write_text(json.dumps(rows, indent=1, default=lambda o: o.tolist()
                                           if isinstance(o, np.ndarray) else str(o)))
    one, two = rows[1]["steps"], rows[2]["steps"]
    result = compare(one, two)
    updated = [s + 1 for s, v in enumerate(one["actor/grad_norm"]) if v > 0]
    same = int(np.sum(np.asarray(rows[1]["strict_trained"])
                      == np.asarray(rows[2]["strict_trained"])))
    verdicts = [rows[r]["verdict"]["verdict"] for r in (1, 2)]
    met = result["met"] and verdicts[0] == verdicts[1]
    diverged = (f"the responses first differ at step {result['diverged_at']}"
                if result["diverged_at"] else "the responses are alike at every step")
    text = "\n".join([
        SECTION, "",
        "`benchmarks/bench_ranks.py`: the CPU run with the verl engine (`kedro run --env cpu "
        "--params train.engine=verl`), whole (data_prep, train, merge, eval), on one gloo "
        "rank and on two (`train.verl.trainer_n_gpus_per_node=2`: FSDP2 shards the actor; "
        "one rollout server for both ranks, `rollout_tensor_model_parallel_size=2`, so that "
        "both runs sample alike), same seed and data, "
        f"{args.steps} steps, LoRA dropout off in both (each rank draws its own dropout masks "
        "for its half of the batch: with dropout the runs are two random draws of one "
        "algorithm). The rollout orders each batch by prompt before sampling "
        "(`hf_rollout.HFServer._next_batch`), so that a row draws the same random numbers "
        "whatever order verl's agent-loop workers sent the requests in.", "",
        f"Machine: {machine()}. Seed {args.seed}.", "",
        *step_lines(one, two), "",
        f"Before the responses diverge ({diverged}), the largest relative difference: "
        + ", ".join(f"{k} {v:.1e}" for k, v in result["worst"].items())
        + f" (goal: at most {RTOL:g}, or {ATOL:g} apart where a value is zero up to rounding, "
        "as the policy loss of an on-policy step is; what differs is the order of float32 "
        "sums: FSDP2 all-reduces the two halves' gradients and verl averages the ranks' loss "
        "metrics). A step whose groups each scored alike has no advantage and no gradient; "
        f"the steps that updated the adapter: {', '.join(map(str, updated)) or 'none'} "
        "(the steps after them sample from the updated policy, in both runs).",
        "",
        "| ranks | verdict | strict accuracy, base -> trained | flexible accuracy | wall time "
        "(s) | peak memory (MiB) |", "|---|---|---|---|---|---|",
        *[f"| {r} | {rows[r]['verdict']['verdict']} | "
          f"{rows[r]['base']['strict_accuracy']:.3f} -> "
          f"{rows[r]['trained']['strict_accuracy']:.3f} | "
          f"{rows[r]['base']['flexible_accuracy']:.3f} -> "
          f"{rows[r]['trained']['flexible_accuracy']:.3f} | {rows[r]['wall_s']:.0f} | "
          f"{rows[r]['peak_mib']:.0f} |" for r in (1, 2)], "",
        f"The two trained models' strict outcome is the same on {same} of "
        f"{len(rows[1]['strict_trained'])} held-out prompts.", "",
        f"Goal: the same mathematics before the responses diverge, and the same verdict: "
        f"{'met' if met else 'NOT met'}.", ""])
    print(text)
    if not args.no_write:
        write_section(text, SECTION)
    if not met or any(math.isnan(v) for v in result["worst"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
