"""GPU first light: real GRPO steps on a GPU box from one upload, rung by rung.

    python3 scripts/gpu_first_light.py --out $OUT/fl [--rungs a0,imports,a,b,c,c2,e]
    python3 scripts/gpu_first_light.py --out $OUT/fl --rungs v,d,smoke-data_prep,...
                                       [--bundles .gpu] [--site /tmp/fl-site] [--device cpu]

On the box (an image with torch, transformers and peft, without verl, Ray, Kedro or MLflow;
docs/gpu.md, "First light"), run from the repository's root after the upload that carried
``.gpu/a`` (`make gpu-first-light` builds it). It unpacks every ``BUNDLES/*/*.txz`` into
``--site`` (once), puts ``src`` and the site on PYTHONPATH, then runs each rung in a
process of its own with a time limit:

    a0       the GPU is seen; a bf16 matmul (TFLOP/s); driver, memory
    imports  what each later rung imports, with versions and paths
    a        eval's generator (the project's HF generation) on a tiny model built here
    b        TRL GRPO, 4 steps, through the trl engine (train_trl)
    c        verl run_ppo, 4 steps, the transformers rollout (ENGINE: hf), LoRA, a
             checkpoint, verl's export and the project's verified merge, tiny model
    c2       the same on SmolLM2-135M, its GGUF joined from the parts in BUNDLES/b, c...
             (or /tmp/parts): runs only where every part is there
    e        `kedro run`, stage by stage (data_prep, preflight, train, merge, eval),
             the trl engine and HF eval, on the tiny model
    v        the vLLM set (`make vllm-set`: BUNDLES/v1, v2, v3 or their files copied into
             /tmp/parts) as far as it has arrived: what imports and loads (vLLM; its CUDA
             kernels; FlashAttention-3)
    d        verl run_ppo with vLLM's rollout (ENGINE: vllm), 4 steps, the tiny model,
             LoRA, a checkpoint, export and merge
    smoke-data_prep, smoke-preflight, smoke-train, smoke-merge, smoke-eval
             conf/smoke through `kedro run --env smoke`, one stage per rung (each within one
             10-minute command; the project's state stays in WORK between calls on a warm
             box), on SmolLM2-135M when its GGUF is there, else the tiny model

A rung whose inputs are missing is skipped with the reason; a failed rung does not stop
the next independent one. Everything goes to --out as three files (what a lent box's
output folder can bring back): ``env.txt`` (nvidia-smi, the interpreter, pip freeze,
disks), ``rungs.log`` (every rung's output, headed) and ``verdict.json``; the last line
printed is the verdict, e.g. ``FIRST-LIGHT a0=pass imports=pass a=pass b=pass c=FAIL(...)``.

``--device cpu`` runs the same rungs on a machine without CUDA (verl in its CPU mode,
train.verl.device: cpu): everything up to the point where CUDA is needed.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import first_light_bundle  # noqa: E402  (the standard library only, as this part needs)
import vllm_set  # noqa: E402  (its receiving part: the standard library only)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PARTS = Path("/tmp/parts")  # where later uploads' files are copied (docs/gpu.md)
# (rung, time limit in seconds, what it proves); the order they run in.
RUNGS = [
    ("a0", 60, "the GPU is seen, a bf16 matmul runs"),
    ("imports", 120, "the bundles import on this interpreter"),
    ("a", 150, "the project's HF generation (eval's generator)"),
    ("b", 240, "TRL GRPO, 4 steps, through the trl engine"),
    ("c", 420, "verl run_ppo with the transformers rollout, LoRA, checkpoint, merge"),
    ("c2", 480, "rung c on SmolLM2-135M"),
    ("e", 580, "kedro run, stage by stage, trl engine and HF eval"),
    ("v", 240, "the vLLM set so far: what imports and loads"),
    ("d", 560, "verl run_ppo with vLLM's rollout, LoRA, checkpoint, merge"),
    *((f"smoke-{stage}", limit, f"kedro run --env smoke --pipelines {stage}")
      for stage, limit in (("data_prep", 240), ("preflight", 300), ("train", 580),
                           ("merge", 300), ("eval", 580))),
]
SMOKE_STAGES = [name for name, *_ in RUNGS if name.startswith("smoke-")]
# Rungs that need vLLM's CUDA kernels: not on a CPU (data_prep, preflight and merge run
# anywhere: `--device cpu` checks them here).
NEEDS_CUDA = {"d", "smoke-train", "smoke-eval"}
# What a rung imports beyond the image (rung -> modules): missing ones skip the rung. Every
# rung that scores a reward needs pebble (the first GPU box lacked it: every reward scored 0).
NEEDS = {
    "a": ["rl_pipeline.evaluation.generate"],
    "b": ["trl", "pebble", "rl_pipeline.engines.trl.train"],
    "c": ["verl", "ray", "transfer_queue", "mlflow", "pebble",
          "rl_pipeline.engines.verl.engine"],
    "c2": ["verl", "ray", "transfer_queue", "mlflow", "pebble", "gguf"],
    "e": ["kedro", "kedro_mlflow", "mlflow", "trl", "pebble", "scipy"],
    "v": ["vllm"],
    "d": ["vllm", "verl", "ray", "transfer_queue", "mlflow", "pebble"],
    "smoke-data_prep": ["kedro", "kedro_mlflow", "mlflow", "pebble"],
    "smoke-preflight": ["verl", "kedro", "kedro_mlflow", "mlflow"],
    "smoke-train": ["vllm", "verl", "ray", "kedro", "kedro_mlflow", "mlflow", "pebble"],
    "smoke-merge": ["kedro", "kedro_mlflow", "mlflow"],
    "smoke-eval": ["vllm", "kedro", "kedro_mlflow", "mlflow", "pebble", "scipy"],
}
IMPORTS = ["torch", "transformers", "tokenizers", "peft", "accelerate", "numpy", "pandas",
           "pyarrow", "trl", "verl", "ray", "transfer_queue", "tensordict", "hydra",
           "omegaconf", "datasets", "pydantic", "gguf", "kedro", "kedro_datasets",
           "kedro_mlflow", "mlflow", "sqlalchemy", "math_verify", "pebble", "scipy",
           "rl_pipeline", "rl_pipeline.engines.verl.hf_rollout"]


# -- the orchestrator (standard library only: it runs before the bundles are unpacked) --

def unpack_bundles(bundles: Path, site: Path) -> list[str]:
    """Unpack every first-light ``bundles/*/*.txz`` into ``site`` once (a marker per
    archive). The vLLM set's units are left to vllm_set.receive: unpacked here as well,
    each was unpacked twice on the lent H100."""
    done = []
    for archive in sorted(bundles.glob("*/*.txz")):
        if re.fullmatch(vllm_set.UNIT_FILE, archive.name):
            continue
        marker = site / f".unpacked-{archive.name}-{archive.stat().st_size}"
        if not marker.exists():
            first_light_bundle.unpack(archive, site)
            marker.touch()
        done.append(archive.name)
    return done


def machine_facts(out: Path, python: str) -> None:
    """env.txt: what the box is, for docs/gpu.md's status table."""
    commands = [["nvidia-smi"], [python, "-c", "import sys, torch; print(sys.version); "
                "print('prefix', sys.prefix, 'base', sys.base_prefix); print('torch', "
                "torch.__version__, torch.__file__, 'cuda', torch.version.cuda, "
                "torch.cuda.is_available())"],
                [python, "-m", "pip", "list", "--format=freeze"], ["nproc"], ["free", "-g"],
                ["df", "-h", "/tmp", "/dev/shm", str(ROOT)]]
    with open(out / "env.txt", "w") as f:
        for command in commands:
            f.write(f"$ {' '.join(command)}\n")
            try:
                result = subprocess.run(command, capture_output=True, text=True, timeout=60)
                f.write(result.stdout + result.stderr + "\n")
            except (OSError, subprocess.TimeoutExpired) as exc:
                f.write(f"({exc})\n")


def run_rungs(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    started = time.time()
    verdict: dict[str, Any] = {"device": args.device, "rungs": {}}
    machine_facts(out, python)
    env = dict(os.environ, PYTHONUNBUFFERED="1", KEDRO_DISABLE_TELEMETRY="true",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    paths = [str(ROOT / "src"), str(ROOT)]
    if args.site and args.bundles.is_dir():
        try:
            verdict["unpacked"] = unpack_bundles(args.bundles, args.site)
        except (OSError, EOFError, tarfile.TarError, lzma.LZMAError) as exc:  # truncated
            verdict["unpacked"] = f"failed: {exc}"
        try:  # the vLLM set's units, from this upload's folders or earlier ones'
            received = vllm_set.receive([*sorted(args.bundles.glob("v*")), PARTS], args.site)
            if received["unpacked"] or received["waiting"]:
                verdict["vllm_set"] = received
        except (OSError, ValueError, EOFError, tarfile.TarError, lzma.LZMAError) as exc:
            verdict["vllm_set"] = f"failed: {exc}"
        paths.append(str(args.site))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = open(out / "rungs.log", "a")  # noqa: SIM115 (every rung appends)
    for name, limit, what in RUNGS:
        if name not in args.rungs:
            continue
        result: dict[str, Any] = {"what": what, "limit_s": limit}
        reason = None
        if name != "a0" and args.device == "cuda" and \
                verdict["rungs"].get("a0", {}).get("status") != "pass":
            reason = "needs rung a0 (no GPU seen)"
        elif name in NEEDS_CUDA and args.device != "cuda":
            reason = "vLLM's kernels need CUDA"
        elif name == "c2" and not gguf_parts(args.bundles):
            reason = "needs the GGUF parts"
        elif missing := first_light_bundle.missing_modules(python, env, NEEDS.get(name, [])):
            reason = f"needs {', '.join(missing)}"
        if reason:
            result.update(status="skipped", reason=reason)
        else:
            # A rung never outlasts the call: the box's command limit kills everything,
            # and a verdict that says "timeout" beats none.
            if args.budget_s:
                limit = int(min(limit, args.budget_s - (time.time() - started) - 5))
                result["limit_s"] = limit
        if not reason and limit < 10:
            result.update(status="skipped", reason=f"--budget-s {args.budget_s} spent")
        elif not reason:
            log.write(f"\n===== rung {name}: {what} (limit {limit}s) =====\n")
            log.flush()
            command = [python, str(Path(__file__).resolve()), "--rung", name, "--device",
                       args.device, "--work", str(work), "--bundles", str(args.bundles)]
            began = time.time()
            offset = log.tell()
            # Straight into the log, not through a pipe: when the box is reclaimed mid-rung
            # the log still shows how far the rung got (a piped rung's output was lost).
            # A session of its own, so that a timeout also stops what the rung started
            # (Ray's workers, kedro's children), which would hold the GPU for the next rung.
            child = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc: int | str = child.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                rc = "timeout"
            log.flush()
            with open(out / "rungs.log", errors="replace") as written:
                written.seek(offset)
                text = written.read()
            found = [line for line in text.splitlines() if line.startswith("RESULT ")]
            result.update(json.loads(found[-1][7:]) if found else {})
            result["seconds"] = round(time.time() - began, 1)
            if rc == 0 and found:
                result["status"] = "pass"
            else:
                tail = [line for line in text.splitlines() if line.strip()][-3:]
                result.update(status="FAIL", rc=rc, tail=tail)
        verdict["rungs"][name] = result
        (out / "verdict.json").write_text(json.dumps(verdict, indent=2, default=str))
        print(f"rung {name}: {result['status']} {result.get('reason', '')}", flush=True)
    log.close()
    verdict["seconds"] = round(time.time() - started, 1)
    (out / "verdict.json").write_text(json.dumps(verdict, indent=2, default=str))
    return verdict


def verdict_line(verdict: dict[str, Any]) -> str:
    parts = []
    for name, result in verdict["rungs"].items():
        status = result["status"]
        if status == "FAIL":  # (80 characters cut the module's name off an error on the box)
            status = f"FAIL(rc {result.get('rc')}: {(result.get('tail') or [''])[-1][:160]})"
        parts.append(f"{name}={status}")
    return f"FIRST-LIGHT {' '.join(parts)} ({verdict.get('seconds')} s)"


def gguf_parts(bundles: Path) -> list[Path]:
    """The GGUF's parts (``<name>.part-aa`` ...) wherever the uploads left them."""
    found = {p.name: p for folder in (bundles, PARTS) if folder.is_dir()
             for p in folder.rglob(f"{GGUF_NAME}.part-*") if not p.name.endswith(".sha256")}
    return [found[name] for name in sorted(found)]


# -- the rungs (each in its own process, with the bundles on PYTHONPATH) --

def report(**facts: Any) -> None:
    print("RESULT " + json.dumps(facts, default=str), flush=True)


def rung_a0(device: str, work: Path, bundles: Path) -> None:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                             "cuda_available": torch.cuda.is_available()}
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device seen by torch")
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}",
                     gpus=torch.cuda.device_count())
    size, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    (a @ b).sum().item()  # warm-up
    began, repeats = time.perf_counter(), 10
    for _ in range(repeats):
        c = a @ b
    c.sum().item()
    seconds = time.perf_counter() - began
    facts.update(matmul=f"{size}^3 {str(dtype)[6:]} x{repeats}",
                 tflops=round(2 * size**3 * repeats / seconds / 1e12, 2))
    report(**facts)


def rung_imports(device: str, work: Path, bundles: Path) -> None:
    import importlib

    found, failed = {}, {}
    for name in IMPORTS:
        try:
            module = importlib.import_module(name)
            found[name] = (getattr(module, "__version__", ""),
                           str(Path(getattr(module, "__file__", "") or "").parent))
        except Exception as exc:  # every failure is a fact to record, not a stop
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    for name, (version, where) in found.items():
        print(f"{name:40s} {version:24s} {where}")
    for name, error in failed.items():
        print(f"{name:40s} FAILED {error}")
    report(imported=len(found), failed=failed)


def tiny_model(work: Path) -> Path:
    """A two-layer Qwen2 with a BPE tokenizer trained on GSM8K questions (built once)."""
    folder = work / "tiny_model"
    if (folder / "config.json").is_file():
        return folder
    from rl_pipeline.testing import build_bpe_tokenizer, build_tiny_causal_lm

    texts = [f"{r['question']} {r['answer']}" for r in gsm8k_records(2000)]
    tokenizer = build_bpe_tokenizer(texts, vocab_size=400)
    return build_tiny_causal_lm(folder, tokenizer)


def gsm8k_records(rows: int, split: str = "train") -> list[dict[str, str]]:
    """The first ``rows`` of the repository's GSM8K file."""
    with open(ROOT / f"data/01_raw/gsm8k/{split}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(rows), f, strict=False)]


def gsm8k_frame(rows: int, split: str = "train"):
    """GSM8K prompts in verl's schema, as data_prep writes them."""
    import pandas as pd

    from rl_pipeline.data.prompts import to_verl_frame
    from rl_pipeline.params import DataPrepParams

    records = gsm8k_records(rows, split)
    work = pd.DataFrame({"question": [r["question"] for r in records],
                         "answer": [r["answer"] for r in records],
                         "ground_truth": [r["answer"].split("#### ")[-1] for r in records]})
    return to_verl_frame(work, DataPrepParams(), split, "images")


DIGIT_REWARD = ("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n")


def digit_reward(work: Path):
    from rl_pipeline.params import RewardParams

    path = work / "digit_reward.py"
    path.write_text(DIGIT_REWARD)
    return RewardParams(self_test="off",
                        custom_reward_function={"path": str(path), "name": "score"})


def rung_a(device: str, work: Path, bundles: Path) -> None:
    from rl_pipeline.evaluation.generate import SamplingSettings, generate

    model = tiny_model(work)
    prompts = [list(p) for p in gsm8k_frame(16, "test")["prompt"]]
    settings = SamplingSettings(max_new_tokens=32, min_new_tokens=32, temperature=1.0,
                                top_p=1.0)
    began = time.perf_counter()
    run = generate(str(model), prompts, settings, backend="hf", batch_size=16,
                   own_process=device == "cuda")
    seconds = time.perf_counter() - began
    tokens = sum(g.tokens for g in run.generations)
    report(device=run.device, generations=len(run.generations), tokens=tokens,
           seconds=round(seconds, 2), tokens_per_s=round(tokens / seconds, 1),
           peak_memory_mib=round(run.peak_memory_mib))


def rung_b(device: str, work: Path, bundles: Path) -> None:
    import torch

    from rl_pipeline.engines.trl.train import train_trl
    from rl_pipeline.params.trl import TrlParams

    model = tiny_model(work)
    params = TrlParams(apply_lora=True, lora_rank=8, lora_alpha=16, num_generations=4,
                       per_device_train_batch_size=8, max_completion_length=32,
                       num_iterations=1, beta=0.0, logging_steps=1, max_steps=4,
                       save_steps=4, learning_rate=1e-3, seed=0)
    began = time.perf_counter()
    run = train_trl(params, digit_reward(work), gsm8k_frame(32), None, str(model),
                    work / "trl_checkpoints", resume="never")
    seconds = time.perf_counter() - began
    rewards = [h["reward"] for h in run.history if "reward" in h]
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0
    report(device="cuda" if torch.cuda.is_available() else "cpu", steps=run.summary["steps"],
           rewards=rewards, seconds=round(seconds, 1), peak_gpu_mib=round(peak))


def verl_run(device: str, work: Path, model: Path, name: str, prompts: int,
             reward: Any, response_length: int, engine: str = "hf") -> dict[str, Any]:
    """plan_verl + train_verl as the train node runs them, then verl's export and the
    project's verified merge."""
    import mlflow
    import torch

    from rl_pipeline.engines.verl.checkpoint import export_result
    from rl_pipeline.engines.verl.config import LaunchInputs
    from rl_pipeline.engines.verl.engine import train_verl
    from rl_pipeline.engines.verl.plan import plan_verl
    from rl_pipeline.merge.standalone import make_standalone_model
    from rl_pipeline.params import DataParams, MergeParams
    from rl_pipeline.params.verl import VerlParams

    root = work / name
    root.mkdir(parents=True, exist_ok=True)
    frame = gsm8k_frame(prompts)
    frame.to_parquet(root / "train.parquet")
    frame.head(4).to_parquet(root / "val.parquet")
    uri = f"sqlite:///{root}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    run_id = client.create_run(mlflow.set_experiment("first_light").experiment_id,
                               run_name=name).info.run_id
    cpu = device == "cpu"
    verl = VerlParams(
        device=device, ENGINE=engine, trainer_n_gpus_per_node="auto",
        rollout_tensor_model_parallel_size="auto", actor_fsdp_config_offload_policy=False,
        data_train_batch_size=4, rollout_n=4, actor_ppo_mini_batch_size=4,
        actor_ppo_micro_batch_size_per_gpu=4, rollout_log_prob_micro_batch_size_per_gpu=4,
        ref_log_prob_micro_batch_size_per_gpu=4, actor_model_lora_rank=8,
        actor_model_lora_alpha=16, actor_use_kl_loss=False, rollout_dtype="float32" if cpu
        else "bfloat16", total_training_steps=4, trainer_save_freq=4, trainer_test_freq=-1,
        trainer_val_before_train=False, rollout_max_probs_diff=0.05,
        rollout_min_probs_pearson=0.9,
        # vLLM's torch.compile and CUDA-graph capture took about 100 s of rung d's first
        # try on the lent H100, which ran out of its budget with the server ready; the
        # rung proves the path (serve, LoRA sync, log-probs), conf/smoke's rungs the speed.
        rollout_enforce_eager=engine == "vllm")
    inputs = LaunchInputs(train_files=str(root / "train.parquet"),
                          val_files=str(root / "val.parquet"), model_path=str(model),
                          checkpoints_dir=str(root / "checkpoints"), tracking_uri=uri,
                          rollouts_per_step=2)
    plan = plan_verl(verl, DataParams(data_max_response_length=response_length), reward,
                     inputs, gpus_visible=torch.cuda.device_count(), training=True,
                     train_rows=len(frame))
    began = time.perf_counter()
    run = train_verl(plan.overrides, run_id, max_probs_diff=verl.rollout_max_probs_diff,
                     min_probs_pearson=verl.rollout_min_probs_pearson)
    seconds = time.perf_counter() - began
    adapter = export_result(root / "checkpoints", root / "scratch", run.summary)
    merged = make_standalone_model(str(adapter), str(model), MergeParams(), root / "scratch")
    metrics = {key: [m.value for m in sorted(client.get_metric_history(run_id, key),
                                             key=lambda m: m.step)]
               for key in ("critic/score/mean", "timing_s/step", "timing_s/gen",
                           "timing_s/update_actor", "perf/max_memory_allocated_gb",
                           "perf/throughput", "training/rollout_actor_probs_pearson_corr",
                           "training/rollout_probs_diff_mean")}
    return {"device": device, "steps": run.summary.get("steps"), "seconds": round(seconds, 1),
            "rollout_policy": run.summary.get("rollout_policy"), "metrics": metrics,
            "merge_verified": merged.metadata["verification"]["passed"],
            "preflight": {k: plan.report[k] for k in ("hardware", "rollout", "host")
                          if k in plan.report}}


def rung_c(device: str, work: Path, bundles: Path) -> None:
    model = tiny_model(work)
    report(**verl_run(device, work, model, "verl_tiny", 16, digit_reward(work), 32))


def rung_c2(device: str, work: Path, bundles: Path) -> None:
    from rl_pipeline.models.resolve import resolve_model
    from rl_pipeline.params import RewardParams

    gguf = work / GGUF_NAME
    if not gguf.is_file():  # each part and the whole checked against their sha256
        first_light_bundle.join_parts(gguf_parts(bundles), gguf)
    model = Path(resolve_model(str(gguf), work / "resolved").path)
    report(**verl_run(device, work, model, "verl_smollm2", 16, RewardParams(self_test="off"),
                      64))


def rung_v(device: str, work: Path, bundles: Path) -> None:
    """What the vLLM set brings so far, level by level (each unit's `enables`)."""
    import importlib

    levels: dict[str, str] = {}
    try:
        import vllm
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # noqa: F401

        levels["python"] = f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}"
    except Exception as exc:  # a level that fails is the fact to report
        levels["python"] = f"FAILED {type(exc).__name__}: {exc}"[:300]
    try:
        importlib.import_module("vllm._C_stable_libtorch")
        import vllm.platforms.cuda  # noqa: F401

        levels["core kernels"] = "loaded"
    except Exception as exc:
        levels["core kernels"] = f"FAILED {type(exc).__name__}: {exc}"[:300]
    try:
        from vllm.vllm_flash_attn import flash_attn_interface as fa

        levels["fa3"] = "available" if fa.FA3_AVAILABLE else \
            f"unavailable: {fa.FA3_UNAVAILABLE_REASON}"[:300]
    except Exception as exc:
        levels["fa3"] = f"FAILED {type(exc).__name__}: {exc}"[:300]
    for level, state in levels.items():
        print(f"{level:14s} {state}")
    if levels["python"].startswith("FAILED"):
        raise RuntimeError(f"vLLM does not import: {levels['python']}")
    report(levels=levels)


def rung_d(device: str, work: Path, bundles: Path) -> None:
    model = tiny_model(work)
    report(**verl_run(device, work, model, "verl_vllm_tiny", 16, digit_reward(work), 32,
                      engine="vllm"))


def smoke_project(work: Path) -> Path:
    """conf/smoke's project in ``work``, made by the first smoke rung and kept by the
    later ones (each stage reads what the one before it saved)."""
    project = work / "smoke_project"
    if not (project / "conf").is_dir():
        scratch_project(work, project)
    return project


def rung_smoke(stage: str, work: Path, bundles: Path) -> None:
    """One conf/smoke stage through `kedro run`, on SmolLM2-135M when its GGUF has arrived
    (else the tiny model); eval compares with vLLM as conf/smoke says."""
    gguf = work / GGUF_NAME
    if not gguf.is_file() and len(gguf_parts(bundles)) >= 2:
        first_light_bundle.join_parts(gguf_parts(bundles), gguf)
    model = gguf if gguf.is_file() else tiny_model(work)
    project = smoke_project(work)
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "kedro", "run", "--env", "smoke",
                             "--pipelines", stage, "--params", f"base_model={model}"],
                            cwd=project, capture_output=True, text=True, timeout=560)
    print(f"--- kedro {stage}: rc {result.returncode}\n{result.stdout[-4000:]}"
          f"{result.stderr[-12000:]}", flush=True)
    if result.returncode:
        raise RuntimeError(f"kedro run --env smoke --pipelines {stage}: rc {result.returncode}")
    report(stage=stage, model=str(model), seconds=round(time.perf_counter() - began, 1))


def scratch_project(work: Path, project: Path | None = None) -> Path:
    """The project's configuration in ``work``, its raw data linked (read only), so that
    the runs' data, checkpoints and MLflow store stay out of the repository."""
    import shutil

    project = project or work / "kedro_project"
    if project.exists():
        shutil.rmtree(project)
    (project / "src").mkdir(parents=True)  # the package is the one on PYTHONPATH
    shutil.copy(ROOT / "pyproject.toml", project)
    shutil.copytree(ROOT / "conf", project / "conf", ignore=shutil.ignore_patterns("local"))
    (project / "conf/local").mkdir()
    (project / "data").mkdir()
    (project / "data/01_raw").symlink_to(ROOT / "data/01_raw")
    return project


def rung_e(device: str, work: Path, bundles: Path) -> None:
    """conf/cpu's trl run, shortened, through kedro: each stage its own process, in a
    scratch copy of the project."""
    model = tiny_model(work)
    project = scratch_project(work)
    params = (f"base_model={model},train.engine=trl,train.trl.max_steps=4,"
              "train.trl.save_steps=4,eval.max_prompts=16,eval.backend=hf")
    stages = {}
    for stage in ("data_prep", "preflight", "train", "merge", "eval"):
        began = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "kedro", "run", "--env", "cpu",
                                 "--pipelines", stage, "--params", params],
                                cwd=project, capture_output=True, text=True, timeout=560)
        stages[stage] = {"rc": result.returncode, "seconds": round(time.perf_counter()
                                                                   - began, 1)}
        print(f"--- kedro {stage}: rc {result.returncode}\n{result.stdout[-4000:]}"
              f"{result.stderr[-8000:]}", flush=True)
        if result.returncode:
            raise RuntimeError(f"kedro run --pipelines {stage} failed: {stages}")
    report(stages=stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "fl")
    parser.add_argument("--rungs", default=",".join(name for name, *_ in RUNGS
                                                    if name not in {"v", *NEEDS_CUDA}),
                        help="which rungs, in RUNGS' order (default: the first light's, "
                        "without vLLM); on cuda a0 is always added")
    parser.add_argument("--bundles", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--site", type=lambda v: Path(v) if v else None,
                        default=Path("/tmp/fl-site"), help="where the bundles are unpacked "
                        "(their packages go on PYTHONPATH); '' to unpack nothing (a machine "
                        "with the project's own environment)")
    parser.add_argument("--work", default="/tmp/fl-work", help="models, runs, checkpoints")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="end every rung within this many seconds of the start (set it "
                             "below the call's limit; a rung cut short is reported 'timeout')")
    parser.add_argument("--rung", help=argparse.SUPPRESS)  # a child process: one rung
    args = parser.parse_args()
    if args.rung:
        try:
            if args.rung.startswith("smoke-"):
                rung_smoke(args.rung.removeprefix("smoke-"), Path(args.work), args.bundles)
            else:
                globals()[f"rung_{args.rung}"](args.device, Path(args.work), args.bundles)
        except Exception:
            traceback.print_exc()
            sys.exit(1)
        return
    args.rungs = args.rungs.split(",")
    if args.device == "cuda" and "a0" not in args.rungs:
        # Every later rung on a GPU waits for a0's verdict: a call that left it out (the
        # second call of a session, on a warm box) skipped them all (5 s of checks).
        args.rungs.insert(0, "a0")
    print(verdict_line(run_rungs(args)), flush=True)


if __name__ == "__main__":
    main()
