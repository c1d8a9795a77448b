"""Benchmark: batched generation against one prompt at a time, greedy, on CPU.

SmolLM2-135M-Instruct (the CPU default model) on the first GSM8K test prompts, with our
Hugging Face back end (``HFGenerator``): all prompts in one batch versus one ``generate``
call per prompt. Checks that the texts are identical and reports throughput in response
tokens per second, twice:
  * natural: each response ends at end-of-sequence, as in a real eval run; the batch keeps
    computing rows that have finished until its longest row ends;
  * full length: end-of-sequence suppressed, every response runs to the cap; this isolates
    the throughput of batching from the waste on finished rows.
Writes the results to docs/benchmarks.md.

Usage: ``.venv/bin/python benchmarks/bench_generation.py [--prompts N]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_data_prep import machine, write_section
from rl_pipeline.data.prompts import chat_messages
from rl_pipeline.evaluation.generate import HFGenerator, SamplingSettings
from rl_pipeline.models.resolve import resolve_model
from rl_pipeline.params import DataPrepParams

ROOT = Path(__file__).resolve().parents[1]
GGUF = ROOT / "data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SECTION = "## eval: batched generation"


def run(generator: HFGenerator, conversations, settings: SamplingSettings, batch: int):
    start = time.perf_counter()
    out = generator.generate(conversations, settings, batch_size=batch)
    seconds = time.perf_counter() - start
    return out, seconds, sum(g.tokens for g in out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--full-length-tokens", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    model = resolve_model(GGUF, ROOT / "data/06_models/resolved").path
    params = DataPrepParams(
        instruction='Let\'s think step by step and output the final answer after "####".')
    lines = (ROOT / "data/01_raw/gsm8k/test.jsonl").read_text().splitlines()[:args.prompts]
    conversations = [chat_messages(json.loads(line)["question"], params) for line in lines]
    generator = HFGenerator(str(model))
    # The baseline is the best one-at-a-time set-up: the model as it is, dynamic cache.
    baseline = HFGenerator(str(model), expand_gqa=False)
    rows = []
    for mode, settings in (
        ("natural", SamplingSettings(max_new_tokens=args.max_new_tokens, greedy=True)),
        ("full length", SamplingSettings(max_new_tokens=args.full_length_tokens, greedy=True,
                                         min_new_tokens=args.full_length_tokens)),
    ):
        print(f"[{mode}] batched ...", flush=True)
        batched, t_batch, n_batch = run(generator, conversations, settings, len(conversations))
        print(f"[{mode}] one at a time ...", flush=True)
        single, t_single, n_single = run(baseline, conversations, settings, 1)
        same = sum(a.text == b.text for a, b in zip(batched, single, strict=True))
        rows.append((mode, settings.max_new_tokens, n_batch / t_batch, n_single / t_single,
                     same, t_single / t_batch))

    text = "\n".join([
        SECTION, "",
        f"`benchmarks/bench_generation.py`: SmolLM2-135M-Instruct (float32), greedy, the first "
        f"{len(conversations)} GSM8K test prompts. Batched: our `HFGenerator`, all prompts in "
        "one batch, static KV cache, grouped-query attention expanded to multi-head. One at a "
        "time: one `generate` call per prompt with the model as it is and the dynamic cache "
        "(its fastest set-up).", "",
        f"Machine: {machine()}.", "",
        "| mode | max new tokens | batched tokens/s | one at a time tokens/s | identical texts "
        "| ratio |",
        "|---|---|---|---|---|---|",
        *(f"| {m} | {n} | {b:.1f} | {s:.1f} | {same}/{len(conversations)} | **{r:.2f}x** |"
          for m, n, b, s, same, r in rows),
        "",
        "Natural: responses end at end-of-sequence, as in an eval run; the batch keeps "
        "computing finished rows until its longest response ends. Full length: "
        "end-of-sequence suppressed, so both sides generate the same number of tokens; this "
        "is the throughput of batching itself. The gap is the batch's work on finished rows. "
        "Without the two CPU measures (static cache, expanded attention) the batched rate was "
        "about 75 tokens/s (3.4x): with a padding mask, transformers copies the whole "
        "grouped-query KV cache for every head at every step.", "",
        f"Goal: at least 4x with identical texts: "
        f"{'met' if all(r[5] >= 4 and r[4] == len(conversations) for r in rows) else 'not met'}"
        " on this machine.", ""])
    print()
    print(text)
    for m, _, _, _, same, r in rows:
        print(f"RATIO {m}: {r:.2f}x, identical {same}/{len(conversations)}")
    if not args.no_write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
