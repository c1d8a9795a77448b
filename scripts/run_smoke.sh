#!/usr/bin/env bash
# The offline GPU kit's one step, on the box, from this repository (the upload's working tree):
#     bash scripts/run_smoke.sh KIT        (KIT: the folder scripts/gpu_kit.py made, or the
#                                           parts of it uploads have brought so far)
#
# No venv and no copy of the project. The image's python3 is itself a venv: a venv made from
# it would see the base interpreter's packages, not the image's torch. So the kit's wheels go
# into $SITE with `pip install --target` (scripts/install_wheelhouse.sh, checked,
# --no-index --no-deps), and every command runs on the image's python3 with
# PYTHONPATH=<this repository>/src:$SITE, the project first. KIT/env.sh sets that up for a
# shell of your own (`. KIT/env.sh`).
#
# Stages, each run under `timeout $STAGE_TIMEOUT` and tee'd into $LOGS (at most 8 files):
#   01-setup.log    env: python, sys.prefix, torch, GPU, the image's pip list --format=freeze;
#                   install: the wheels into $SITE, then on the image's python3 with $SITE
#                   torch's version and path (the image's) and every kit package's imports;
#                   project: rl_pipeline imports from this repository's src/
#   02-model.log    model: the model's parts checked and joined into KIT/model/ (or BASE_MODEL)
#   03-data_prep.log 04-preflight.log 05-train.log 06-merge.log 07-eval.log:
#                   `kedro run --env smoke --pipelines STAGE --params base_model=MODEL`, one
#                   process each
#   verdict.json    every stage's status, exit code, seconds and log; rewritten after each
#                   stage; its verdict is also the last line printed.
# Each part is checked when it is used: a missing wheel part stops the install and the kedro
# stages (the model is still joined), a missing model part stops the kedro stages; each says
# which part. What is in place already ($SITE holding this wheelhouse, KIT/model holding this
# model) is kept, and its parts are then not needed.
#
# Settings (environment):
#   PYTHON=python3        the image's Python
#   LOGS=KIT/logs         where the logs and verdict.json go (the output folder that comes back)
#   STAGE_TIMEOUT=580     seconds per stage (a box's command runs at most 10 minutes)
#   STOP_AFTER=           install (stop before data_prep), data_prep, preflight, train, merge
#   SITE=KIT/site         where the wheels are installed
#   BASE_MODEL=           a model on the box to use instead of the kit's
#   IMPORT_FAILURES_OK=1  list kit modules that do not import without failing the install
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
[[ -n ${1:-} && -d $1 ]] || {
    echo "usage: bash scripts/run_smoke.sh KIT (the folder scripts/gpu_kit.py made)" >&2; exit 2; }
kit=$(cd "$1" && pwd)
PYTHON=${PYTHON:-python3}
SITE=${SITE:-$kit/site}
LOGS=${LOGS:-$kit/logs}
STAGE_TIMEOUT=${STAGE_TIMEOUT:-580}
STOP_AFTER=${STOP_AFTER:-}
BASE_MODEL=${BASE_MODEL:-}
case $STOP_AFTER in
    ""|install|data_prep|preflight|train|merge) ;;
    *) echo "run_smoke: STOP_AFTER=$STOP_AFTER: expected install, data_prep, preflight, train" \
            "or merge" >&2; exit 2 ;;
esac
mkdir -p "$LOGS" "$(dirname "$SITE")"
LOGS=$(cd "$LOGS" && pwd)
SITE="$(cd "$(dirname "$SITE")" && pwd)/$(basename "$SITE")"
unset PYTHONPATH
export PYTHONUNBUFFERED=1  # the logs keep up with the stages, a timed-out one included
record_file=$(mktemp "${TMPDIR:-/tmp}/run_smoke.XXXXXX")
trap 'rm -f "$record_file"' EXIT
declare -A opened=()

write_verdict() {  # the stages so far, and the verdict, into $LOGS/verdict.json
    "$PYTHON" - "$record_file" "$LOGS/verdict.json" "$kit" "$repo" "$STOP_AFTER" \
        "$STAGE_TIMEOUT" "${1:-running}" <<'EOF'
import json, sys

records, out, kit, repo, stop_after, timeout, state = sys.argv[1:]
stages = []
for line in open(records):
    name, status, rc, seconds, log, note = line.rstrip("\n").split("\t")
    stages.append({"stage": name, "status": status, "rc": int(rc) if rc else None,
                   "seconds": int(seconds) if seconds else None, "log": log or None,
                   "note": note or None})
bad = [s for s in stages if s["status"] in ("failed", "timed out")]
skipped = [s for s in stages if s["status"] == "skipped"]
if bad:
    verdict = "failed: " + ", ".join(f"{s['stage']} ({s['status']})" for s in bad)
elif state == "running":
    verdict = "running"
elif skipped:
    verdict = "incomplete: " + ", ".join(f"{s['stage']} skipped ({s['note']})" for s in skipped)
else:
    verdict = "ok" + (f", stopped after {stop_after}" if stop_after else "")
json.dump({"verdict": verdict, "stages": stages, "kit": kit, "repository": repo,
           "stop_after": stop_after or None, "stage_timeout_s": int(timeout)},
          open(out, "w"), indent=1)
print(verdict)
EOF
}

record() {  # NAME STATUS RC SECONDS LOG NOTE
    local note=${6//$'\t'/ }
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${note//$'\n'/ | }" \
        >> "$record_file"
    write_verdict running > /dev/null
}

stage() {  # NAME LOG COMMAND...: COMMAND under timeout, tee'd into $LOGS/LOG, recorded
    local name=$1 log=$2 start=$SECONDS rc status=ok note= before
    shift 2
    if [[ -z ${opened[$log]:-} ]]; then : > "$LOGS/$log"; opened[$log]=1; fi
    before=$(wc -l < "$LOGS/$log")
    echo "run_smoke: == $name ($(date -u +%H:%M:%S) UTC; timeout ${STAGE_TIMEOUT}s) ==" \
        | tee -a "$LOGS/$log"
    timeout -k 10 "$STAGE_TIMEOUT" "$@" 2>&1 | tee -a "$LOGS/$log"
    rc=${PIPESTATUS[0]}
    if (( rc == 124 || rc == 137 )); then
        status="timed out" note="after ${STAGE_TIMEOUT} s"
    elif (( rc != 0 )); then
        # this stage's last lines of output
        status=failed note=$(tail -n +"$((before + 2))" "$LOGS/$log" | grep -v '^\s*$' \
            | tail -n 6 | cut -c1-300)
    fi
    record "$name" "$status" "$rc" "$((SECONDS - start))" "$log" "$note"
    echo "run_smoke: $name: $status ($((SECONDS - start)) s)" | tee -a "$LOGS/$log"
    return "$rc"
}

skip() {  # NAME WHY [STATUS]: not run, because of WHY
    record "$1" "${3:-skipped}" "" "" "" "$2"
    echo "run_smoke: $1: ${3:-skipped} ($2)"
}

finish() {
    local verdict
    verdict=$(write_verdict done)
    echo "run_smoke: logs in $LOGS; verdict: $verdict"
    [[ $verdict == ok* ]]
    exit $?
}

# env: what the box is (informative; nothing depends on it)
stage env 01-setup.log "$PYTHON" - <<'EOF'
import shutil, subprocess, sys

print(f"python {sys.version.split()[0]} at {sys.executable}")
print(f"sys.prefix {sys.prefix}; sys.base_prefix {sys.base_prefix}; "
      f"a venv: {sys.prefix != sys.base_prefix}")
try:
    import torch
    print(f"torch {torch.__version__} from {torch.__file__}; CUDA {torch.version.cuda}, "
          f"available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
except Exception as exc:
    print(f"torch: not importable: {exc}")
for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], ["nproc"], ["df", "-h", "/tmp", "/dev/shm"]):
    if shutil.which(cmd[0]):
        try:
            subprocess.run(cmd, timeout=30)
        except subprocess.TimeoutExpired:
            print(f"{cmd[0]}: no answer in 30 s")
print("pip list --format=freeze:", flush=True)
subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"])
EOF

# install: the kit's wheels into $SITE, checked on the image's python3 with $SITE
why=
if [[ ! -f $kit/wheels/manifest.json && -f $SITE/.wheelhouse.sha256 ]]; then
    skip install "no $kit/wheels/manifest.json; $SITE as installed before" "not needed"
elif ! stage install 01-setup.log env TARGET="$SITE" PYTHON="$PYTHON" \
        bash "$here/install_wheelhouse.sh" "$kit/wheels"; then
    why="the install did not pass"
fi
cat > "$kit/env.sh" <<EOF
# . $kit/env.sh: the image's $PYTHON with the project and the kit (scripts/run_smoke.sh)
export PYTHONPATH="$repo/src:$SITE"
export PATH="$SITE/bin:\$PATH"
export KEDRO_DISABLE_TELEMETRY=true
EOF
export PYTHONPATH="$repo/src:$SITE" PATH="$SITE/bin:$PATH" KEDRO_DISABLE_TELEMETRY=true
if [[ -n $why ]]; then
    skip project "$why"
else
    stage project 01-setup.log "$PYTHON" - "$repo/src" <<'EOF' || why="the project does not import"
import sys
from pathlib import Path

import rl_pipeline

where, src = Path(rl_pipeline.__file__).resolve(), Path(sys.argv[1]).resolve()
print(f"rl_pipeline {rl_pipeline.__version__} from {where}")
if not where.is_relative_to(src):
    sys.exit(f"rl_pipeline is not this repository's ({src})")
EOF
fi

# model: its parts checked and joined into KIT/model (kept when there already)
model= no_model=
if [[ -n $BASE_MODEL ]]; then
    skip model "BASE_MODEL=$BASE_MODEL" "not needed"
    model=$BASE_MODEL
elif [[ ! -f $kit/model.json ]]; then
    skip model "no model.json in the kit and no BASE_MODEL"
elif stage model 02-model.log env -u PYTHONPATH "$PYTHON" - "$kit" <<'EOF'
import hashlib, json, shutil, sys, tarfile
from pathlib import Path

kit = Path(sys.argv[1])
m = json.loads((kit / "model.json").read_text())
root, new = kit / "model", kit / "model.new"
if (root / m["file"]).exists() and (root / ".sha256").is_file() \
        and (root / ".sha256").read_text().strip() == m["sha256"]:
    print(f"run_smoke: the model is in place already: {root / m['file']}; its parts are not needed")
    sys.exit(0)


# The wheel parts' check in install_wheelhouse.sh is the same: that script also travels
# alone with a wheelhouse (make wheelhouse), so neither imports the other.
def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


bad = []
for p in m["parts"]:
    path = kit / p["file"]
    if not path.is_file():
        bad.append(f"missing: {p['file']}")
    elif path.stat().st_size != p["size"]:
        bad.append(f"wrong size: {p['file']} ({path.stat().st_size} bytes, expected {p['size']})")
    elif sha256(path) != p["sha256"]:
        bad.append(f"wrong sha256: {p['file']}")
if bad:
    sys.exit(f"run_smoke: the model's parts are not all there ({len(m['parts'])} expected in "
             f"{kit}):\n  " + "\n  ".join(bad))
shutil.rmtree(new, ignore_errors=True)
new.mkdir()
joined = new / (m["file"] if m["kind"] == "gguf" else "model.tar")
h = hashlib.sha256()
with open(joined, "wb") as out:
    for p in m["parts"]:
        with open(kit / p["file"], "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
if h.hexdigest() != m["sha256"]:
    sys.exit("run_smoke: the joined model's sha256 differs from model.json's")
if m["kind"] != "gguf":
    with tarfile.open(joined) as t:
        t.extractall(new, filter="data")
    joined.unlink()
(new / ".sha256").write_text(m["sha256"] + "\n")
shutil.rmtree(root, ignore_errors=True)
new.rename(root)
print(f"run_smoke: the model: {root / m['file']} ({m['size'] / 2**20:,.1f} MiB, "
      f"{len(m['parts'])} parts checked)")
EOF
then
    model=$kit/model/$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["file"])' \
        "$kit/model.json")
else
    no_model="the model did not pass"
fi

if [[ $STOP_AFTER == install ]]; then
    echo "run_smoke: stopped before data_prep (STOP_AFTER=install)"
    finish
fi

# the smoke configuration through kedro, one stage per process, from this repository
cd "$repo" || exit 1
[[ -n $why || -n $model ]] || why=${no_model:-no model}
n=3
for s in data_prep preflight train merge eval; do
    log=$(printf '%02d-%s.log' "$n" "$s")
    n=$((n + 1))
    if [[ -n $why ]]; then
        skip "$s" "$why"
    else
        stage "$s" "$log" "$PYTHON" -m kedro run --env smoke --pipelines "$s" \
            --params "base_model=$model" || why="$s did not pass"
    fi
    if [[ $STOP_AFTER == "$s" ]]; then
        echo "run_smoke: stopped after $s (STOP_AFTER=$s)"
        finish
    fi
done
[[ -n $why ]] || echo "run_smoke: done; reports in $repo/data/08_reporting, runs in $repo/mlflow.db"
finish
