"""Benchmark: our overlong-prompt filter against verl's, on the same 50,000+ prompts.

Measures, in one run, on the same rows and the same 16k-vocabulary byte-level BPE tokenizer:
  (a) our data_prep length filter (``scan_lengths``: template, byte bound, exact counts where
      needed plus a 10,000-row sample for the report's percentiles);
  (b) verl's own overlong filtering in ``RLHFDataset`` (``maybe_filter_out_long_prompts``,
      with the YAML default of one worker, as verl does it at trainer start);
  (c) the fast tokenizer batch-encoding every already-templated prompt.
Checks that (a) keeps exactly the rows (b) keeps, prints the ratios last and records them
in docs/benchmarks.md.

Usage: ``make benchmarks`` or ``.venv/bin/python benchmarks/bench_data_prep.py [--rows N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

from rl_pipeline.data.lengths import count_tokens, render_prompts, scan_lengths
from rl_pipeline.data.prompts import chat_messages
from rl_pipeline.params import DataPrepParams
from rl_pipeline.testing import build_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[1]
GSM8K = [ROOT / "data/01_raw/gsm8k/train.jsonl", ROOT / "data/01_raw/gsm8k/test.jsonl"]
RESULTS = ROOT / "docs/benchmarks.md"
SECTION = "## data_prep: overlong-prompt filter"


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def gsm8k_rows(n: int) -> list[dict]:
    records = [json.loads(line) for path in GSM8K for line in path.read_text().splitlines()]
    # Repeat GSM8K with a distinct suffix per copy: GSM8K-sized, all distinct prompts.
    return [{**records[i % len(records)],
             "question": f"{records[i % len(records)]['question']} (variant {i // len(records)})"}
            for i in range(n)]


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    import tokenizers
    import transformers
    import verl

    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
            f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, "
            f"verl {verl.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=52_752)  # GSM8K train+test, six times
    parser.add_argument("--limit", type=int, default=1024, help="data_max_prompt_length")
    parser.add_argument("--tight-limit", type=int, default=140,
                        help="a second, tight limit that makes many rows need exact counts")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/")
    args = parser.parse_args()
    datasets.disable_caching()  # verl's filter must not be served from a cache on repeats

    params = DataPrepParams(
        instruction='Let\'s think step by step and output the final answer after "####".')
    rows = gsm8k_rows(args.rows)
    conversations = [chat_messages(r["question"], params) for r in rows]
    print(f"{len(rows)} prompts; training a 16k-vocabulary BPE tokenizer ...", flush=True)
    tokenizer = build_bpe_tokenizer((r["question"] + "\n" + r["answer"] for r in rows[:8792]),
                                    vocab_size=16_000)

    with tempfile.TemporaryDirectory() as tmp:
        parquet = Path(tmp) / "prompts.parquet"
        pd.DataFrame({"prompt": conversations,
                      "extra_info": [{"index": i} for i in range(len(rows))]}).to_parquet(parquet)
        results = {}
        for limit in (args.limit, args.tight_limit):
            config = OmegaConf.create({"max_prompt_length": limit, "filter_overlong_prompts": False,
                                       "filter_overlong_prompts_workers": 1,
                                       "cache_dir": str(Path(tmp) / "cache")})
            verl_ds = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=config)
            verl_ds.filter_overlong_prompts = True
            print(f"[limit {limit}] (b) verl RLHFDataset filter ...", flush=True)
            t_verl, kept_frame = best_of(2, lambda ds=verl_ds: ds.maybe_filter_out_long_prompts(
                ds.dataframe))
            verl_kept = {e["index"] for e in kept_frame["extra_info"]}

            print(f"[limit {limit}] (a) our filter ...", flush=True)
            t_ours, scan = best_of(3, lambda lim=limit: scan_lengths(
                tokenizer, conversations, lim, sample_size=10_000, seed=0))
            ours_kept = set(range(len(rows))) - set(scan.over_limit(limit).tolist())
            if ours_kept != verl_kept:
                raise SystemExit(f"MISMATCH at limit {limit}: ours keeps {len(ours_kept)}, "
                                 f"verl keeps {len(verl_kept)}")
            results[limit] = {"ours": t_ours, "verl": t_verl, "kept": len(ours_kept),
                              "exact": int((scan.lengths >= 0).sum()), "method": scan.method}

        print("(c) batch-encoding every templated prompt ...", flush=True)
        texts = render_prompts(tokenizer, conversations)
        t_encode, _ = best_of(3, lambda: count_tokens(tokenizer, texts))

    n = len(rows)
    lines = [
        SECTION, "",
        f"`benchmarks/bench_data_prep.py`, {n} GSM8K-sized prompts (GSM8K train+test, repeated "
        "with distinct suffixes), a 16k-vocabulary byte-level BPE tokenizer trained on GSM8K, "
        "ChatML template. Best of 3 (ours, encode) or 2 (verl) runs. Our filter includes "
        "templating and the exact 10,000-row sample behind the report's percentiles.", "",
        f"Machine: {machine()}.", "",
        "| limit | (a) ours rows/s | (b) verl RLHFDataset rows/s | rows kept (identical) "
        "| rows tokenized by (a) | (a)/(b) |",
        "|---|---|---|---|---|---|",
    ]
    for limit, r in results.items():
        lines.append(f"| {limit} | {n / r['ours']:,.0f} | {n / r['verl']:,.0f} | "
                     f"{r['kept']} | {r['exact']} | **{r['verl'] / r['ours']:.1f}x** |")
    lines += ["", f"(c) batch-encoding every templated prompt: {n / t_encode:,.0f} rows/s "
              f"(ours at limit {args.limit} is {t_encode / results[args.limit]['ours']:.1f}x "
              "that).", "",
              "At the default limit no prompt's byte bound reaches the limit, so only the "
              "sample is tokenized. At a limit near the typical prompt length (the second row) "
              "the byte bound (about 4 bytes per token for this tokenizer) clears no row and "
              "every prompt is tokenized; the gain over verl is then only that of batch "
              "encoding over per-row apply_chat_template.", ""]
    text = "\n".join(lines)
    print()
    print(text)
    ratio = results[args.limit]["verl"] / results[args.limit]["ours"]
    print(f"RATIO ours/verl at limit {args.limit}: {ratio:.2f}x (goal >= 3x); "
          f"ours/encode-all: {t_encode / results[args.limit]['ours']:.2f}x")
    if not args.no_write:
        write_section(text)


def write_section(text: str, section: str = SECTION) -> None:
    """Replace one benchmark's section of docs/benchmarks.md, keeping the others."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks\n\n"
    if section in old:
        start = old.index(section)
        end = old.find("\n## ", start + len(section))
        old = old[:start] + old[end + 1:] if end != -1 else old[:start]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(old.rstrip("\n") + "\n\n" + text)


if __name__ == "__main__":
    np.set_printoptions(suppress=True)
    main()
