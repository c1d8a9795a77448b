#!/usr/bin/env bash
# The offline GPU kit's one step (scripts/gpu_kit.py made the folder this lies in):
#     bash run_smoke.sh [KIT]          (PYTHON=python3 by default: the image's Python)
#
# 1. checks every file of the kit against SHA256SUMS;
# 2. makes KIT/venv over the image's own packages (--system-site-packages: its torch, CUDA
#    libraries and the rest the wheels were chosen against), so nothing of the image changes;
# 3. installs the wheels (wheels/install_wheelhouse.sh: checked, --no-index --no-deps), then
#    the project from the kit (--no-deps: the lock is complete);
# 4. unpacks the model and runs `kedro run --env smoke` (data_prep, train, merge, eval) on it,
#    in KIT/work/rl_pipeline. STOP_AFTER=install stops before the first kedro run,
#    STOP_AFTER=preflight after the preflight.
set -euo pipefail

kit=$(cd "${1:-$(dirname "$0")}" && pwd)
PYTHON=${PYTHON:-python3}
work="$kit/work"
cd "$kit"
sha256sum --quiet -c SHA256SUMS
echo "run_smoke: every file of the kit checked"

if [[ ! -x $kit/venv/bin/python ]]; then
    "$PYTHON" -m venv --system-site-packages "$kit/venv"
fi
venv_python="$kit/venv/bin/python"
PYTHON="$venv_python" bash "$kit/wheels/install_wheelhouse.sh" "$kit/wheels"

rm -rf "$work" && mkdir -p "$work"
cat "$kit"/project.tar.part-* | tar -x -C "$work"
cat "$kit"/model.tar.part-* | tar -x -C "$work"
"$venv_python" -m pip install --quiet --no-index --no-deps --no-build-isolation \
    -e "$work/rl_pipeline"

if [[ ${STOP_AFTER:-} == install ]]; then
    echo "run_smoke: installed; stopped before data_prep (STOP_AFTER=install)"
    exit 0
fi

cd "$work/rl_pipeline"
# kedro-mlflow calls the `mlflow` executable: the venv's first on PATH.
export KEDRO_DISABLE_TELEMETRY=true PATH="$kit/venv/bin:$PATH"
model="$work/model"
kedro() { "$venv_python" -m kedro "$@"; }
kedro run --env smoke --pipelines data_prep --params "base_model=$model"
kedro run --env smoke --pipelines preflight --params "base_model=$model"
if [[ ${STOP_AFTER:-} == preflight ]]; then
    echo "run_smoke: stopped after the preflight (STOP_AFTER=preflight)"
    exit 0
fi
for stage in train merge eval; do
    kedro run --env smoke --pipelines "$stage" --params "base_model=$model"
done
echo "run_smoke: done; reports in $work/rl_pipeline/data/08_reporting, runs in mlflow.db"
