#!/usr/bin/env bash
# Run a stage of rl_pipeline (or the whole pipeline) as a scheduled job, from cron, a
# systemd timer or any scheduler that runs a command. docs/scheduling.md shows how.
#
#   scripts/scheduled_run.sh STAGE [kedro run options...]
#
# STAGE: data_prep, train, merge, eval, promote or __default__ (all five, one MLflow run each).
# The Kedro environment is $KEDRO_ENV, else cpu on a machine without an NVIDIA GPU and
# local (the base configuration plus conf/local) on one with it, as `make run` chooses; where
# nvidia-smi is installed and fails other than finding no GPU, none: it stops (a GPU host's
# driver problem).
#
# Exit status: 0 the run finished; 75 (EX_TEMPFAIL) nothing was done because a run of
# STAGE is still going in this project; 69 (EX_UNAVAILABLE) nvidia-smi failed and
# $KEDRO_ENV is unset; 64 bad usage; anything else: the run failed, and its MLflow run
# is FAILED with the error as its `error` tag.
set -euo pipefail

usage="usage: $0 STAGE [kedro run options...]; STAGE: data_prep, train, merge, eval, promote or __default__"
if [[ $# -lt 1 || $1 == -* ]]; then
    echo "$usage" >&2
    exit 64  # EX_USAGE
fi
case $1 in
    data_prep|train|merge|eval|promote|__default__) ;;
    *) echo "no stage '$1'. $usage" >&2; exit 64 ;;
esac
stage=$1
shift
cd "$(dirname "$(readlink -f "$0")")/.."

# Marks the run as scheduled: it refuses to start beside a run of the same stage.
export RL_PIPELINE_SCHEDULED=1
export KEDRO_DISABLE_TELEMETRY=${KEDRO_DISABLE_TELEMETRY:-true}
python=${PYTHON:-.venv/bin/python}
# A log of plain lines from the first record on, in every process the run starts, and no
# progress bars (rl_pipeline/plain_output.py): set here, before Python starts, as tqdm and
# Kedro read them on import. A logging configuration of your own takes precedence.
if [[ -z ${KEDRO_LOGGING_CONFIG:-} ]]; then
    KEDRO_LOGGING_CONFIG=$("$python" -c \
        'from importlib.resources import files; print(files("rl_pipeline") / "plain_logging.yml")')
    export KEDRO_LOGGING_CONFIG
fi
export TQDM_DISABLE=${TQDM_DISABLE:-1} HF_HUB_DISABLE_PROGRESS_BARS=${HF_HUB_DISABLE_PROGRESS_BARS:-1}
if [[ -n ${KEDRO_ENV:-} ]]; then
    env=$KEDRO_ENV
elif gpus=$(nvidia-smi -L 2>&1); then
    env=local
elif command -v nvidia-smi >/dev/null && [[ $gpus != *"No devices were found"* ]]; then
    # An NVIDIA tool that fails is a GPU host with a driver problem, not a CPU host: the cpu
    # configuration would train another model on another task, unattended. (By hand, `make
    # run` falls back and says so; nobody reads a schedule's choice until it is done.)
    echo "nvidia-smi is installed but failed: ${gpus:0:300}" >&2
    echo "A scheduled run does not fall back to the cpu configuration. Mend the driver," \
        "or set KEDRO_ENV (cpu or local) to choose." >&2
    exit 69  # EX_UNAVAILABLE
else
    env=cpu
fi

echo "$(date '+%Y-%m-%d %H:%M:%S') scheduled run of $stage (kedro env $env) in $PWD"
exec "$python" -m kedro run --pipelines "$stage" --env "$env" "$@"
