"""An offline kit for a known GPU image: the wheels the image lacks and a small model, in parts
that each fit one upload beside this repository's working tree; scripts/run_smoke.sh, run from
the repository on the box, installs them and runs the smoke configuration stage by stage.

    python scripts/gpu_kit.py --freeze FREEZE --out DIR [--model SOURCE] [--part-size 55M]

FREEZE is the image's `python3 -m pip list --format=freeze` (a name alone: present at a
version not known here; scripts/wheelhouse.py). An upload to the box carries at most 64 MiB
(--upload-limit) and the repository's working tree goes with every one, so every part is at
most --part-size (55 MiB) and each part with the tree and the kit's small files must fit the
limit (checked here, per part, in kit.json). DIR receives:
    wheels/              scripts/wheelhouse.py's output for requirements/gpu.lock minus what
                         the image has (parts, manifest)
    model.json           the model's file, size, sha256 and parts
    model.gguf.part-NNN  the model as its GGUF file, split (default: SmolLM2-135M-Instruct
                         Q4_1, which `make model` fetches; the project's resolver loads GGUF);
                         a model folder or a hub id travels as a tar, model.tar.part-NNN;
                         --model none: no model (BASE_MODEL on the box names one)
    SHA256SUMS, kit.json every file's sha256; per part its upload's size, the tree's size
The project itself is not in the kit: it is the repository the upload carries. On the box,
from the repository: `bash scripts/run_smoke.sh DIR` (logs in DIR/logs, or LOGS=...).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wheelhouse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_GGUF = ROOT / "data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PART_SIZE = wheelhouse.DEFAULT_PART_SIZE
UPLOAD_LIMIT = "64M"
# Outputs of earlier versions of this script, removed from DIR when it is rebuilt.
STALE = ("project.tar.part-*", "model.tar.part-*", "model.gguf.part-*", "run_smoke.sh",
         "model.json")


def split_file(path: Path, out: Path, prefix: str, part_size: int) -> wheelhouse.SplitWriter:
    """``path``'s bytes as parts ``prefix``NNN, each at most ``part_size``."""
    writer = wheelhouse.SplitWriter(out, part_size, prefix)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            writer.write(chunk)
    writer.close()
    return writer


def pack_model(source: str, out: Path, part_size: int, scratch: Path) -> dict | None:
    """The model in parts in ``out``; its record for model.json (None: no model).

    A .gguf file travels as it is (the Q4_1 SmolLM2 is 94 MiB: 2 parts); a folder, or what
    a hub id resolves to, as a tar of its files under the folder's name."""
    if source.lower() in ("", "none"):
        return None
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise SystemExit(f"gpu-kit: --model {source} is a file but not a .gguf model")
        writer = split_file(path, out, "model.gguf.part-", part_size)
        return {"kind": "gguf", "file": path.name, "size": writer.size,
                "sha256": writer.total.hexdigest(), "parts": writer.parts, "source": source}
    if not path.is_dir():  # a hub id: resolved (downloaded) here, once
        sys.path.insert(0, str(ROOT / "src"))
        from rl_pipeline.models.resolve import resolve_model

        path = resolve_model(source, scratch / "resolved").path
    name = path.name if Path(source).expanduser().is_dir() else "model"
    files = [(p, f"{name}/{p.relative_to(path)}") for p in sorted(path.rglob("*"))
             if p.is_file()]
    writer = wheelhouse.pack(out, files, part_size, "model.tar.part-")
    return {"kind": "folder", "file": name, "size": writer.size,
            "sha256": writer.total.hexdigest(), "parts": writer.parts, "source": source}


def tree_bytes(out: Path) -> dict:
    """What every upload carries besides the kit: the repository's tracked files, and the
    untracked ones git does not ignore (the kit's own folder left out)."""
    def listed(*args: str) -> list[Path]:
        proc = subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True,
                              check=True)
        return [ROOT / n for n in proc.stdout.decode().split("\0") if n]

    def size(paths: list[Path]) -> int:
        return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())

    untracked = [p for p in listed("--others", "--exclude-standard")
                 if not p.resolve().is_relative_to(out)]
    tracked, other = size(listed()), size(untracked)
    return {"tracked": tracked, "untracked": other, "total": tracked + other}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--freeze", type=Path, required=True,
                        help="the image's `python3 -m pip list --format=freeze`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(SMOLLM2_GGUF),
                        help="a .gguf file, a model folder, a hub id, or none "
                             "(default: SmolLM2-135M's Q4_1 GGUF)")
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements/gpu.lock")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--platform", default="manylinux_2_35_x86_64")
    parser.add_argument("--part-size", type=wheelhouse.parse_size,
                        default=wheelhouse.parse_size(DEFAULT_PART_SIZE),
                        help=f"largest part (default {DEFAULT_PART_SIZE}iB)")
    parser.add_argument("--upload-limit", type=wheelhouse.parse_size,
                        default=wheelhouse.parse_size(UPLOAD_LIMIT),
                        help="the most one upload carries, the working tree included "
                             f"(default {UPLOAD_LIMIT}iB)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for pattern in STALE:
        for old in out.glob(pattern):
            old.unlink()

    status = wheelhouse.main(["--lock", str(args.lock), "--python-version", args.python_version,
                              "--platform", args.platform, "--exclude-freeze", str(args.freeze),
                              "--part-size", str(args.part_size), "--out", str(out / "wheels")])
    if status:
        return status
    with tempfile.TemporaryDirectory() as tmp:
        model = pack_model(args.model, out, args.part_size, Path(tmp))
    if model is not None:
        (out / "model.json").write_text(json.dumps(model, indent=1) + "\n")

    # (what run_smoke.sh leaves in a kit folder it ran from is not the kit's)
    files = sorted(p for p in out.rglob("*") if p.is_file()
                   and p.relative_to(out).as_posix() not in ("SHA256SUMS", "kit.json", "env.sh")
                   and p.relative_to(out).parts[0] not in ("logs", "site", "site.new", "model",
                                                           "model.new"))
    sums = {p.relative_to(out).as_posix(): wheelhouse.sha256_of(p) for p in files}
    (out / "SHA256SUMS").write_text("".join(f"{h}  {name}\n" for name, h in sums.items()))
    sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in files}
    parts = {n: s for n, s in sizes.items() if ".part-" in n}
    # the small files (manifests, sums; kit.json itself estimated) may ride with any part
    small = sum(s for n, s in sizes.items() if n not in parts) + (
        out / "SHA256SUMS").stat().st_size + 64 * 2**10
    tree = tree_bytes(out)
    uploads = [{"file": n, "bytes": s, "with_tree_bytes": s + tree["total"] + small}
               for n, s in parts.items()]
    over = [u for u in uploads if u["with_tree_bytes"] > args.upload_limit]
    largest = max(sizes.values())
    manifest = json.loads((out / "wheels/manifest.json").read_text())
    summary = {"files": len(files) + 2, "bytes": sum(sizes.values()), "parts": len(parts),
               "part_size": args.part_size, "upload_limit": args.upload_limit,
               "largest_file_bytes": largest, "tree_bytes": tree, "small_files_bytes": small,
               "uploads": uploads, "wheels": len(manifest["wheels"]),
               "on_target": len(manifest["on_target"]),
               "model_parts": len(model["parts"]) if model else 0,
               "model": model and {k: model[k] for k in ("kind", "file", "size", "source")},
               "freeze": args.freeze.name}
    (out / "kit.json").write_text(json.dumps(summary, indent=1) + "\n")
    mib = lambda n: f"{n / 2**20:,.1f} MiB"  # noqa: E731
    print(f"gpu-kit: the working tree that goes with every upload: {mib(tree['total'])} "
          f"({mib(tree['tracked'])} tracked, {mib(tree['untracked'])} untracked); the kit's "
          f"small files: {mib(small)}")
    for u in uploads:
        print(f"  {u['file']:<40} {mib(u['bytes']):>10}  with the tree {mib(u['with_tree_bytes'])}"
              + ("  OVER THE LIMIT" if u in over else ""))
    print(f"gpu-kit: {summary['files']} files, {mib(summary['bytes'])}, {len(parts)} parts "
          f"({summary['wheels']} wheels; model in {summary['model_parts']} parts), largest "
          f"file {mib(largest)}, in {out}; on the box, from the repository: "
          f"bash scripts/run_smoke.sh {out.name}")
    if largest > args.part_size:
        print(f"gpu-kit: a file is over {args.part_size} bytes", file=sys.stderr)
        return 1
    if over:
        print(f"gpu-kit: {len(over)} parts with the working tree exceed one upload "
              f"({mib(args.upload_limit)}): {', '.join(u['file'] for u in over)}; use a "
              "smaller --part-size", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
