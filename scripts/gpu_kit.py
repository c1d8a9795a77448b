"""An offline kit for a known GPU image: the wheels the image lacks, a small model, this
project, and one script that installs them and runs the smoke configuration end to end.

    python scripts/gpu_kit.py --freeze FREEZE --out DIR [--model SOURCE] [--part-size 60M]

FREEZE is the image's `python3 -m pip list --format=freeze`. DIR receives, every file at most
--part-size (60 MiB: what one transfer to an offline box may carry):
    wheels/              scripts/wheelhouse.py's output for requirements/gpu.lock minus what
                         the image has at the locked version (parts, manifest, installer)
    model.tar.part-NNN   the model as a Hugging Face folder (default: SmolLM2-135M-Instruct,
                         converted from the GGUF that `make model` fetches)
    project.tar.part-NNN this project at HEAD (`git archive`)
    run_smoke.sh         on the box: check every part, make a venv over the image's packages,
                         install the wheels and the project, run `kedro run --env smoke`
                         (data_prep, train, merge, eval) on the kit's model
    SHA256SUMS, kit.json every file's sha256; file count, total size and part count
Copy DIR to the box and run `bash DIR/run_smoke.sh` there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wheelhouse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_GGUF = ROOT / "data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RUNNER = Path(__file__).resolve().parent / "run_smoke.sh"


def pack_folder(folder: Path, out: Path, prefix: str, arcroot: str, part_size: int) -> list:
    """``folder``'s files as one tar (under ``arcroot``/) in parts ``prefix``NNN."""
    files = [(p, f"{arcroot}/{p.relative_to(folder)}") for p in sorted(folder.rglob("*"))
             if p.is_file()]
    return wheelhouse.pack(out, files, part_size, prefix).parts


def model_folder(source: str, scratch: Path) -> Path:
    """A Hugging Face folder of ``source`` (a GGUF file, a folder or a hub id) in bf16,
    the dtype vLLM and the actor load anyway: half the bytes to carry."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "src"))
    from rl_pipeline.models.resolve import resolve_model

    resolved = resolve_model(source, scratch / "resolved").path
    out = scratch / "model"
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="50MB")
    AutoTokenizer.from_pretrained(resolved).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--freeze", type=Path, required=True,
                        help="the image's `python3 -m pip list --format=freeze`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(SMOLLM2_GGUF),
                        help="a .gguf file, a model folder or a hub id (default: SmolLM2-135M)")
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements/gpu.lock")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--platform", default="manylinux_2_35_x86_64")
    parser.add_argument("--part-size", type=wheelhouse.parse_size,
                        default=wheelhouse.parse_size("60M"))
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    status = wheelhouse.main(["--lock", str(args.lock), "--python-version", args.python_version,
                              "--platform", args.platform, "--exclude-freeze", str(args.freeze),
                              "--part-size", str(args.part_size), "--out", str(out / "wheels")])
    if status:
        return status
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        model = model_folder(args.model, scratch)
        model_parts = pack_folder(model, out, "model.tar.part-", "model", args.part_size)
        archive = scratch / "project.tar"
        subprocess.run(["git", "archive", "--format=tar", "--prefix=rl_pipeline/",
                        "-o", str(archive), "HEAD"], cwd=ROOT, check=True)
        writer = wheelhouse.SplitWriter(out, args.part_size, "project.tar.part-")
        for old in out.glob("project.tar.part-*"):
            old.unlink()
        with open(archive, "rb") as f:
            while chunk := f.read(1 << 20):
                writer.write(chunk)
        writer.close()
    shutil.copyfile(RUNNER, out / RUNNER.name)
    (out / RUNNER.name).chmod(0o755)

    files = sorted(p for p in out.rglob("*") if p.is_file()
                   and p.relative_to(out).as_posix() not in ("SHA256SUMS", "kit.json"))
    sums = {str(p.relative_to(out)): wheelhouse.sha256_of(p) for p in files}
    (out / "SHA256SUMS").write_text("".join(f"{h}  {name}\n" for name, h in sums.items()))
    sizes = {str(p.relative_to(out)): p.stat().st_size for p in files}
    largest = max(sizes.values())
    summary = {"files": len(files) + 2, "bytes": sum(sizes.values()),
               "parts": sum(1 for n in sizes if ".tar.part-" in n),
               "largest_file_bytes": largest,
               "wheels": json.loads((out / "wheels/manifest.json").read_text())["wheels"]
               .__len__(), "model_parts": len(model_parts), "model": args.model,
               "freeze": args.freeze.name}
    (out / "kit.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"gpu-kit: {summary['files']} files, {summary['bytes'] / 2**20:,.1f} MiB, "
          f"{summary['parts']} parts ({summary['wheels']} wheels, model in "
          f"{len(model_parts)} parts), largest file {largest / 2**20:.1f} MiB, in {out}; "
          f"on the box: bash {out.name}/{RUNNER.name}")
    if largest > args.part_size:
        print(f"gpu-kit: a file is over {args.part_size} bytes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
