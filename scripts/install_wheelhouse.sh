#!/usr/bin/env bash
# Install a wheelhouse made by scripts/wheelhouse.py, on the target, with no network:
#     bash install_wheelhouse.sh DIR          (PYTHON=python3 by default: the target's Python)
#     TARGET=FOLDER bash install_wheelhouse.sh DIR
#
# Without TARGET the wheels go into PYTHON's own environment. With TARGET they go into FOLDER
# (`pip install --target`), for PYTHONPATH=FOLDER on PYTHON, and PYTHON's environment stays
# as it is: the way to add packages to an image whose python3 is itself a venv (a venv made
# from it, --system-site-packages or not, would see the base interpreter's packages, not the
# image's). A FOLDER that already holds this wheelhouse (FOLDER/.wheelhouse.sha256) is kept:
# the parts are then not needed.
#
# 1. checks that every part named in DIR/manifest.json is there, with its size and sha256;
# 2. joins the parts, checks the tar's sha256, unpacks it into a temporary folder and checks
#    every wheel's sha256;
# 3. checks that what the wheelhouse left to the target (manifest "on_target") is installed
#    there at that version (at any version for a package the target's freeze named alone);
# 4. pip install --no-index --no-deps (--target FOLDER.new, then renamed to FOLDER): --no-deps
#    because the lock is complete (every dependency of the GPU stack is a wheel here or on the
#    target already), so pip has nothing to resolve and reaches for no index;
# 5. pip check: a broken requirement of a locked package fails the install; one of a package
#    the image carries beside the stack is reported only;
# 6. with TARGET, on PYTHON with PYTHONPATH=FOLDER: the packages left to the target are still
#    the target's (none is shadowed by FOLDER), torch's version and path are printed (the
#    target's torch, where the wheelhouse left torch to it), and every top-level module of
#    every wheel in FOLDER imports (IMPORT_FAILURES_OK=1: failures are listed, not fatal).
set -euo pipefail

dir=${1:?usage: install_wheelhouse.sh DIR (the folder with manifest.json and the parts)}
PYTHON=${PYTHON:-python3}
TARGET=${TARGET:-}
manifest="$dir/manifest.json"
[[ -f $manifest ]] || { echo "install_wheelhouse: no $manifest" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/wheelhouse.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

tar_sha=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["tar"]["sha256"])' \
    "$manifest")
installed=
if [[ -n $TARGET ]]; then
    mkdir -p "$(dirname "$TARGET")"
    TARGET="$(cd "$(dirname "$TARGET")" && pwd)/$(basename "$TARGET")"
    if [[ -f $TARGET/.wheelhouse.sha256 && $(cat "$TARGET/.wheelhouse.sha256") == "$tar_sha" ]]
    then
        installed=yes
        echo "install_wheelhouse: $TARGET holds this wheelhouse already (tar sha256" \
             "${tar_sha:0:12}...); its parts are not needed"
    fi
fi

# 1-2. parts, tar, wheels
if [[ -z $installed ]]; then
"$PYTHON" - "$dir" "$tmp" <<'EOF'
import hashlib, json, sys, tarfile
from pathlib import Path

src, tmp = Path(sys.argv[1]), Path(sys.argv[2])
m = json.loads((src / "manifest.json").read_text())

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()

bad = []
for p in m["parts"]:
    path = src / p["file"]
    if not path.is_file():
        bad.append(f"missing: {p['file']}")
    elif path.stat().st_size != p["size"]:
        bad.append(f"wrong size: {p['file']} ({path.stat().st_size} bytes, expected {p['size']})")
    elif sha256(path) != p["sha256"]:
        bad.append(f"wrong sha256: {p['file']}")
if bad:
    sys.exit("install_wheelhouse: the parts are not all there:\n  " + "\n  ".join(bad)
             + f"\n  ({len(m['parts'])} parts expected in {src})")

tar = tmp / "wheelhouse.tar"
with open(tar, "wb") as out:  # cat the parts back together
    for p in m["parts"]:
        with open(src / p["file"], "rb") as f:
            while chunk := f.read(1 << 20):
                out.write(chunk)
if sha256(tar) != m["tar"]["sha256"]:
    sys.exit("install_wheelhouse: the joined tar's sha256 differs from the manifest's")
with tarfile.open(tar) as t:
    t.extractall(tmp, filter="data")
tar.unlink()
wheels = tmp / "wheelhouse" / "wheels"
wrong = [w["file"] for w in m["wheels"]
         if not (wheels / w["file"]).is_file() or sha256(wheels / w["file"]) != w["sha256"]]
if wrong:
    sys.exit("install_wheelhouse: wheels missing or corrupt: " + ", ".join(wrong))
print(f"install_wheelhouse: {len(m['parts'])} parts, {len(m['wheels'])} wheels checked "
      f"({m['wheels_size'] / 1e6:,.0f} MB)")
EOF
fi

# 3. what the wheelhouse counts on the target to have
# (pip list, not pip freeze: freeze prints `name @ file://...` for what came from a file;
# with TARGET, what PYTHON has without the folder)
if [[ -n $TARGET ]]; then
    env -u PYTHONPATH "$PYTHON" -m pip list --format=json > "$tmp/installed.json"
else
    "$PYTHON" -m pip list --format=json > "$tmp/installed.json"
fi
"$PYTHON" - "$manifest" "$tmp/installed.json" <<'EOF'
import json, re, sys

m = json.load(open(sys.argv[1]))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(d["name"]): d["version"] for d in json.load(open(sys.argv[2]))}
# the locked version, or a local build of it (torch 2.11.0+cu130 for torch==2.11.0); any
# version where the freeze named the package alone ("*")
missing = [f"{e['name']}=={e['locked']} (target has {have.get(e['name'], 'none')})"
           for e in m["on_target"]
           if e["name"] not in have or (e["version"] != "*" and have[e["name"]].split("+")[0]
                                        != e["locked"].split("+")[0])]
if missing:
    sys.exit("install_wheelhouse: the wheelhouse was built for a target that has these, "
             "and this one does not:\n  " + "\n  ".join(missing)
             + "\n  rebuild it with this machine's `pip list --format=freeze` as --exclude-freeze")
EOF

# 4. install, offline
if [[ -z $installed ]]; then
    if [[ -n $TARGET ]]; then
        rm -rf "$TARGET.new"
        env -u PYTHONPATH "$PYTHON" -m pip install --quiet --no-index --no-deps \
            --target "$TARGET.new" --find-links "$tmp/wheelhouse/wheels" \
            -r "$tmp/wheelhouse/requirements.txt"
        echo "$tar_sha" > "$TARGET.new/.wheelhouse.sha256"
        rm -rf "$TARGET"
        mv "$TARGET.new" "$TARGET"
        echo "install_wheelhouse: installed into $TARGET (for PYTHONPATH; $PYTHON's" \
             "environment unchanged)"
    else
        "$PYTHON" -m pip install --quiet --no-index --no-deps \
            --find-links "$tmp/wheelhouse/wheels" -r "$tmp/wheelhouse/requirements.txt"
    fi
fi

# 5. pip check (with TARGET: of PYTHON's packages and the folder's together)
if [[ -n $TARGET ]]; then
    check() { PYTHONPATH="$TARGET" "$PYTHON" -m pip check; }
else
    check() { "$PYTHON" -m pip check; }
fi
if check > "$tmp/check.txt" 2>&1; then
    echo "install_wheelhouse: pip check: no broken requirements"
else
    "$PYTHON" - "$manifest" "$tmp/check.txt" <<'EOF'
import json, re, sys

m = json.load(open(sys.argv[1]))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
ours = {w["name"] for w in m["wheels"]} | {w["name"] for w in m["on_target"]}
lines = [line.rstrip() for line in open(sys.argv[2]) if line.strip()]
mine = [line for line in lines if norm(line.split()[0]) in ours]
other = [line for line in lines if line not in mine]
if other:
    print("install_wheelhouse: pip check, packages of the image outside the GPU stack "
          "(not failing):\n  " + "\n  ".join(other))
if mine:
    sys.exit("install_wheelhouse: pip check, broken requirements of the GPU stack:\n  "
             + "\n  ".join(mine))
EOF
fi

# 6. on the target, with the folder: the target's packages, torch, the folder's imports
if [[ -n $TARGET ]]; then
PYTHONPATH="$TARGET" "$PYTHON" - "$TARGET" "$manifest" <<'EOF'
import csv, importlib, importlib.metadata as md, json, os, sys, time
from pathlib import Path

target, m = Path(sys.argv[1]).resolve(), json.load(open(sys.argv[2]))
tolerate = os.environ.get("IMPORT_FAILURES_OK", "") not in ("", "0")
say = lambda text: print(f"install_wheelhouse: {text}", flush=True)


def inside(path) -> bool:
    return Path(path).resolve().is_relative_to(target)


problems = []
for e in m["on_target"]:  # still the target's own
    try:
        where = md.distribution(e["name"]).locate_file("")
    except md.PackageNotFoundError:
        problems.append(f"{e['name']}: not found with PYTHONPATH={target}")
        continue
    if inside(where):
        problems.append(f"{e['name']}: the folder's copy shadows the target's")
torch_left = any(e["name"] == "torch" for e in m["on_target"])
try:
    import torch
except ImportError as exc:
    (problems.append if torch_left else say)(f"torch: not importable: {exc}")
else:
    where = Path(torch.__file__).parent
    whose = "the folder's" if inside(where) else "the target's own"
    say(f"torch {torch.__version__} from {where} ({whose}; CUDA {torch.version.cuda}, "
        f"available: {torch.cuda.is_available()})")
    if torch_left and inside(where):
        problems.append("torch: the folder's copy is imported, not the target's")

# what the folder brings in place of the target's own (informative: the lock wants these)
norm = lambda n: n.lower().replace("_", "-").replace(".", "-")  # noqa: E731
image = {norm(d.metadata["Name"] or ""): d.version
         for d in md.distributions(path=[p for p in sys.path if p and not inside(p)])}
shadowed = sorted(f"{norm(d.metadata['Name'])} {d.version} (the target's: "
                  f"{image[norm(d.metadata['Name'])]})"
                  for d in md.distributions(path=[str(target)])
                  if norm(d.metadata["Name"] or "") in image)
if shadowed:
    say("the folder's copy is imported instead of the target's:\n  " + "\n  ".join(shadowed))

SKIP = {"test", "tests", "doc", "docs", "example", "examples", "benchmarks", "bin"}
modules: dict[str, str] = {}
for info in sorted(target.glob("*.dist-info")):
    with open(info / "RECORD", newline="") as f:
        for row in csv.reader(f):
            path = row[0] if row else ""
            first = path.split("/")[0]
            if "/" in path:
                name = first  # a package (or a namespace) folder
            elif first.endswith(".py"):
                name = first[:-3]
            elif first.endswith((".so", ".pyd")):
                name = first.split(".")[0]
            else:
                continue
            if name.isidentifier() and not name.startswith("_") and name not in SKIP:
                modules.setdefault(name, info.name.split("-")[0])
start, failed, elsewhere = time.monotonic(), [], []
for name, dist in sorted(modules.items()):
    loaded = name in sys.modules
    try:
        module = importlib.import_module(name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: an import must not end the check
        text = str(exc).strip().splitlines()
        failed.append(f"{name} ({dist}): {type(exc).__name__}: {text[0] if text else ''}")
        continue
    paths = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", [])]
    if not any(p and inside(p) for p in paths):
        elsewhere.append(f"{name} ({dist})" + (" (loaded before the check)" if loaded else ""))
say(f"{len(modules) - len(failed)} of {len(modules)} top-level modules of the folder's "
    f"{len(list(target.glob('*.dist-info')))} packages import ({time.monotonic() - start:.1f} s)")
if elsewhere:
    say("imported from outside the folder (the target's copy wins):\n  " + "\n  ".join(elsewhere))
if failed:
    say(("imports that failed (IMPORT_FAILURES_OK: not failing)" if tolerate
         else "imports that failed") + ":\n  " + "\n  ".join(failed))
    if not tolerate:
        problems.append(f"{len(failed)} of the folder's modules do not import")
if problems:
    sys.exit("install_wheelhouse: with PYTHONPATH=" + str(target) + ":\n  "
             + "\n  ".join(problems))
EOF
fi
echo "install_wheelhouse: done"
