#!/usr/bin/env bash
# Install a wheelhouse made by scripts/wheelhouse.py, on the target, with no network:
#     bash install_wheelhouse.sh DIR          (PYTHON=python3 by default: the target's Python)
#
# 1. checks that every part named in DIR/manifest.json is there, with its size and sha256;
# 2. joins the parts, checks the tar's sha256, unpacks it into a temporary folder and checks
#    every wheel's sha256;
# 3. checks that what the wheelhouse left to the target (manifest "on_target") is installed
#    there at that version;
# 4. pip install --no-index --no-deps --find-links: --no-deps because the lock is complete
#    (every dependency of the GPU stack is a wheel here or on the target already), so pip has
#    nothing to resolve and reaches for no index;
# 5. pip check: a broken requirement of a locked package fails the install; one of a package
#    the image carries beside the stack is reported only.
set -euo pipefail

dir=${1:?usage: install_wheelhouse.sh DIR (the folder with manifest.json and the parts)}
PYTHON=${PYTHON:-python3}
manifest="$dir/manifest.json"
[[ -f $manifest ]] || { echo "install_wheelhouse: no $manifest" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/wheelhouse.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# 1-2. parts, tar, wheels
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
             + f"\n  ({len(m['parts'])} parts expected)")

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

# 3. what the wheelhouse counts on the target to have
# (pip list, not pip freeze: freeze prints `name @ file://...` for what came from a file)
"$PYTHON" -m pip list --format=json > "$tmp/installed.json"
"$PYTHON" - "$manifest" "$tmp/installed.json" <<'EOF'
import json, re, sys

m = json.load(open(sys.argv[1]))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(d["name"]): d["version"] for d in json.load(open(sys.argv[2]))}
# the locked version, or a local build of it (torch 2.11.0+cu130 for torch==2.11.0)
missing = [f"{e['name']}=={e['locked']} (target has {have.get(e['name'], 'none')})"
           for e in m["on_target"]
           if have.get(e["name"], "").split("+")[0] != e["locked"].split("+")[0]]
if missing:
    sys.exit("install_wheelhouse: the wheelhouse was built for a target that has these, "
             "and this one does not:\n  " + "\n  ".join(missing)
             + "\n  rebuild it with this machine's `pip list --format=freeze` as --exclude-freeze")
EOF

# 4. install, offline
"$PYTHON" -m pip install --quiet --no-index --no-deps --find-links "$tmp/wheelhouse/wheels" \
    -r "$tmp/wheelhouse/requirements.txt"

# 5. pip check
if "$PYTHON" -m pip check > "$tmp/check.txt" 2>&1; then
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
echo "install_wheelhouse: done"
