"""Benchmark: our streaming LoRA merge against peft's merge_and_unload + save_pretrained.

Builds a sharded Llama-style model of about 1.03B parameters with random weights (bfloat16,
500 MB shards) and a rank-64 all-linear LoRA adapter with random factors, then merges it
twice, each in a fresh process so that peak memory (max RSS) is the merge's own:
  * ours: ``rl_pipeline.merge.lora.merge_lora`` (one shard at a time, float32 arithmetic);
  * peft: ``AutoModelForCausalLM.from_pretrained`` + ``PeftModel.from_pretrained`` +
    ``merge_and_unload`` + ``save_pretrained`` (same shard size).
Checks that both outputs hold the same weights (within bfloat16 rounding), prints the
memory and time ratios last and records them in docs/benchmarks.md.

Usage: ``.venv/bin/python benchmarks/bench_merge.py [--layers N]``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_data_prep import machine, write_section

SECTION = "## merge: streaming LoRA merge"
SHARD = "500MB"

OURS = """
import sys, torch
from rl_pipeline.merge.lora import merge_lora, read_adapter
merge_lora(sys.argv[1], read_adapter(sys.argv[2]), sys.argv[3], dtype=torch.bfloat16)
"""
PEFT = """
import sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
model = PeftModel.from_pretrained(model, sys.argv[2]).merge_and_unload()
model.save_pretrained(sys.argv[3], max_shard_size=sys.argv[4])
"""
# VmHWM, not getrusage's ru_maxrss: the latter survives fork and exec, so a child started by
# a parent holding the model would report the parent's size.
PEAK = ("print(next(int(l.split()[1]) for l in open('/proc/self/status') "
        "if l.startswith('VmHWM')))")


def build(folder: Path, layers: int) -> tuple[Path, Path, int]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=4, tie_word_embeddings=False)
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    params = model.num_parameters()
    base = folder / "base"
    model.save_pretrained(str(base), max_shard_size=SHARD)
    peft_model = get_peft_model(model, LoraConfig(r=64, lora_alpha=32,
                                                  target_modules="all-linear"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    adapter = folder / "adapter"
    peft_model.save_pretrained(str(adapter))
    return base, adapter, params


def measure(code: str, *args: str) -> tuple[float, float]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code + "\n" + PEAK, *args],
                            capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    peak_mib = int(result.stdout.strip().splitlines()[-1]) / 1024
    return seconds, peak_mib


def same_weights(a: Path, b: Path) -> float:
    from safetensors import safe_open

    worst = 0.0
    mine = {}
    for file in sorted(a.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as h:
            mine.update({k: file for k in h.keys()})
    for file in sorted(b.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as h:
            for key in h.keys():
                with safe_open(str(mine[key]), framework="pt") as g:
                    x, y = g.get_tensor(key).float(), h.get_tensor(key).float()
                worst = max(worst, float(((x - y).abs() / (y.abs() + 1e-2)).max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=20)  # about 1.03B parameters
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1] / "benchmarks/.work"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        folder = Path(tmp)
        print("building the model and adapter ...", flush=True)
        base, adapter, params = build(folder, args.layers)
        shards = len(list(base.glob("*.safetensors")))
        print("ours ...", flush=True)
        t_ours, m_ours = measure(OURS, str(base), str(adapter), str(folder / "ours"))
        print("peft ...", flush=True)
        t_peft, m_peft = measure(PEFT, str(base), str(adapter), str(folder / "peft"), SHARD)
        worst = same_weights(folder / "ours", folder / "peft")
        largest = max(f.stat().st_size for f in base.glob("*.safetensors")) / 2**20
        shutil.rmtree(folder / "peft")

    text = "\n".join([
        SECTION, "",
        f"`benchmarks/bench_merge.py`: a Llama-style model of {params / 1e9:.2f}B parameters "
        f"(random, bfloat16, {shards} safetensors shards, largest {largest:.0f} MiB) and a "
        "rank-64 all-linear LoRA adapter; each merge in its own process.", "",
        f"Machine: {machine()}.", "",
        "| | wall time (s) | peak memory (MiB) |",
        "|---|---|---|",
        f"| ours: streaming merge | {t_ours:.1f} | {m_ours:,.0f} |",
        f"| peft: merge_and_unload + save_pretrained | {t_peft:.1f} | {m_peft:,.0f} |",
        f"| **ratio ours/peft** | **{t_ours / t_peft:.2f}x** | **{m_ours / m_peft:.2f}x** |",
        "",
        f"Both outputs hold the same weights: largest relative difference {worst:.2g} "
        "(bfloat16 rounding: ours adds B @ A in float32 and rounds once). Goal: memory at most "
        "0.5x and time at most 1.2x of peft's: "
        f"{'met' if m_ours / m_peft <= 0.5 and t_ours / t_peft <= 1.2 else 'not met'}.", ""])
    print()
    print(text)
    print(f"RATIO memory {m_ours / m_peft:.2f}x (goal <= 0.5), time {t_ours / t_peft:.2f}x "
          "(goal <= 1.2)")
    if not args.no_write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
