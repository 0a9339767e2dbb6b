# SpotGuard developer commands. Every target sets up what it needs itself.
#   make demo    the README's main command: the local stack (moto server on 127.0.0.1) runs a training job
#                that is interrupted, checkpointed, resubmitted elsewhere and finished
#   make demo-capacity  the capacity scenario: spot pools running dry, on-demand, and back to spot
#   make demo-gang  the gang scenario: a job of 2 nodes, one node's instance warned, the gang relaunched once
#   make check   the fast loop while you work, under 30 s: lint + the core's and the CLI's fast tests
#                (make check-agent: the agent's)
#   make test    lint + the whole test suite (what CI runs)
#   make bench   benchmarks that print figures (the interruption path, the job path; checkpoint stall and
#                commit time); make bench-load: the local stack with 200 (and 1,000) instances warned at once
#   make traces  the spot traces make bench-capacity reads, fetched into .traces/ (docs/traces.md)
#   make sam     sam validate --lint and sam build (in a separate virtual environment)
#   make checkov checkov on template.yaml, offline (its own virtual environment: it pins an old boto3);
#                every finding is fixed or skipped with its reason in the resource's Metadata
#   make upgrade every environment rebuilt at the newest versions, its lock in constraints/ rewritten,
#                and the suites run: an upgrade lands as a commit that was tested (docs/layout.md)

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SAM_VENV := .venv-sam
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
PY313 ?= $(shell command -v python3.13 >/dev/null 2>&1 && PYENV_VERSION=3.13.0 python3.13 -c 'import sys; print(sys.executable)' 2>/dev/null)
export SAM_CLI_TELEMETRY := 0
# The suites start hundreds of Python processes (the local stack, the CLI, trainings) that import boto3,
# moto and PyTorch. A machine whose environment sets PYTHONDONTWRITEBYTECODE makes each compile them all
# again; here Python keeps its bytecode (__pycache__, git-ignored; sam build and the wheels leave it out).
export PYTHONDONTWRITEBYTECODE :=

# Every environment the Makefile builds installs the versions it was tested with: constraints/<env>.txt,
# the `pip freeze` of that environment when it last passed (make upgrade writes them). UPGRADE=1 builds
# without them, at the newest versions. The machine's own pip constraints (pip.conf) still apply.
UPGRADE ?=
lock = $(if $(UPGRADE),,-c constraints/$(1).txt)

.PHONY: upgrade setup demo demo-capacity demo-gang check check-agent test test-py313 lint bench bench-load bench-capacity bench-decide bench-replay bench-soak gpu-wheels traces sam checkov events wheels clean

$(BIN)/spotguard: pyproject.toml agent/pyproject.toml constraints/py311.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip $(call lock,py311)
	$(BIN)/pip install --quiet -e ".[dev]" -e ./agent $(call lock,py311)
	# PyTorch for the agent's training tests: pinned, so pip takes the CPU build (3.11) on these machines.
	$(BIN)/pip install --quiet torch==2.13.0 $(call lock,py311)
	@touch $@

setup: $(BIN)/spotguard

demo: setup
	$(BIN)/spotguard local demo

# The capacity scenario: a deadline job moved between two spot pools, on-demand and back by the policy,
# on a clock 60x the wall clock (about three minutes).
demo-capacity: setup
	$(BIN)/spotguard local demo --scenario capacity

# The gang scenario: 2 nodes x 1 process trained as one (torchrun under the agent's wrapper, gloo over
# 127.0.0.1), node 1's instance warned, both nodes checkpointed at one step and relaunched once.
demo-gang: setup
	$(BIN)/spotguard local demo --scenario gang

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole suite on every core (pytest-xdist). The tests are independent: each starts what it needs on a
# free port, in its own temporary folder; tests/faults' cases share one world of their package, so they go
# to one worker together (an xdist_group, --dist loadgroup). The slowest tests are printed. The 2 s rule's
# bound is 3 s here, a margin for a busy machine (tests/conftest.py leaves the garbage collector's full
# passes out of a test's CPU); the 2 s holds in `make check`, the loop it is for.
# A test marked `alone` runs after the rest, by itself: its story plays on the wall clock scaled (the
# capacity and gang demos, the wall-clock replay), which a second worker's load can push off its slack.
test: lint
	SPOTGUARD_FAST_TEST_SECONDS=$${SPOTGUARD_FAST_TEST_SECONDS:-3} $(BIN)/pytest -q -p no:cacheprovider \
	  -n auto --dist loadgroup --durations=15 -m "not alone"
	SPOTGUARD_FAST_TEST_SECONDS=$${SPOTGUARD_FAST_TEST_SECONDS:-3} $(BIN)/pytest -q -p no:cacheprovider \
	  --durations=5 -m alone

# The fast loop: lint, then the tests not marked slow of the core and the CLI, in two processes side by side
# (each collects only its half: pytest-xdist's workers would each collect, and so import, all of it):
# tests/unit (pure: no AWS, no moto, no process started) beside tests/contract and tests/template. The
# agent's fast tests import PyTorch: `make check-agent`. tests/integration, tests/e2e, tests/property,
# tests/faults and tests/packaging run in `make test`.
# A test is marked @pytest.mark.slow (and left out here) when it starts a moto server, deploys the stack
# into moto, runs a training or the agent as a process, or takes more than 2 s (tests/conftest.py fails a
# test not marked slow whose call takes longer; SPOTGUARD_FAST_TEST_SECONDS sets another bound); a test
# file whose every test is slow says so once (pytestmark).
FAST := $(BIN)/pytest -q -p no:cacheprovider -p no:hypothesispytest -m "not slow"
check: lint
	@set +e; out=$$(mktemp -d); \
	$(FAST) tests/unit >$$out/unit 2>&1 & unit=$$!; \
	$(FAST) tests/contract tests/template >$$out/rest 2>&1; rest=$$?; \
	wait $$unit; unit=$$?; \
	echo "== tests/unit"; cat $$out/unit; echo "== tests/contract tests/template"; cat $$out/rest; \
	rm -rf $$out; test $$unit -eq 0 -a $$rest -eq 0

check-agent: setup
	$(FAST) tests/agent

# The Lambda runtime is python3.13: run the suite on it too (the .venv is 3.11, which the code must also run on).
test-py313:
	@test -n "$(PY313)" || { echo "python3.13 not found"; exit 1; }
	$(PY313) -m venv .venv-py313
	.venv-py313/bin/pip install --quiet --upgrade pip $(call lock,py313)
	.venv-py313/bin/pip install --quiet -e ".[dev]" -e ./agent $(call lock,py313)
	SPOTGUARD_FAST_TEST_SECONDS=$${SPOTGUARD_FAST_TEST_SECONDS:-3} .venv-py313/bin/pytest -q -p no:cacheprovider \
	  -n auto --dist worksteal tests/unit tests/template tests/integration

bench: setup
	$(BIN)/python bench/interruptions.py
	$(BIN)/python bench/jobs.py
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/cold_start.py
	$(BIN)/python bench/resume.py

# The Can't Be Late spot traces (docs/traces.md) into .traces/ (git-ignored), each checked against its
# SHA-256 in bench/traces.lock.json: copied from ../shared/traces when it is beside the clone, else
# downloaded from GitHub at the locked commit. They have no licence, so the project holds only the hashes.
traces:
	$(PYTHON) bench/traces.py fetch

# Capacity policies on the Can't Be Late traces (make traces): Table 3, a deadline sweep, two pools
# at once. Long: the omniscient bound and SpotGuard's planner solve a dynamic programme per run.
bench-capacity: setup traces
	$(BIN)/python bench/capacity.py

# The live system on the same traces (spotguard local replay, on the virtual clock): pairs of pools and
# single pools, C=48 R=60 D=0.2, the live cost beside the simulator's for the same starts. Long (about 50
# minutes; --parallel 2 on two idle cores about half that); not in CI.
bench-replay: setup traces
	$(BIN)/python bench/replay.py

# Fifty jobs through the two V100 traces (27 days each) on the virtual clock, with faults at every place
# they can happen (spotguard local soak): what must be zero, counted. Long (about 13 minutes on one core
# here); not in CI.
bench-soak: setup traces
	$(BIN)/spotguard local soak --trace .traces/cant-be-late-2022-10/us-west-2a_v100_1.json \
	  --trace .traces/cant-be-late-2022-10/us-west-2b_v100_1.json --jobs 50 --faults 0.01 --seed 1

# SpotGuard's behaviour recorded (bench/behaviour.py): 300 capacity decisions, 20 simulated runs, two soaks
# and a replay, into .behaviour/$(REV).json; AGAINST=<an earlier record> compares, byte for byte. A change
# that must not change behaviour (a reshape) records before and after. About six minutes.
REV ?= $(shell git rev-parse --short HEAD)
behaviour: setup
	$(BIN)/python bench/behaviour.py --out .behaviour/$(REV).json $(if $(AGAINST),--against $(AGAINST))

# One capacity decision (choose_capacity, 100 random jobs x 4 pools) on one core, as a 1,769 MB Lambda
# has: today's plan against the unbounded one of commit 389ee7e, and the cold import numpy adds.
bench-decide: setup
	taskset -c 0 $(BIN)/python bench/decide.py

# The local stack under load, with Lambda's concurrency played: 200 instances x 4 tasks warned at once,
# the same with AWS's call latencies (--latency, emulator/latency.py), and 1,000 instances x 1 task
# (about 15 minutes in all on two shared cores; each run prints its own set-up and timings).
bench-load: setup
	$(BIN)/python bench/local_load.py --instances 200 --tasks 4
	$(BIN)/python bench/local_load.py --instances 200 --tasks 4 --latency --isolated
	$(BIN)/python bench/local_load.py --instances 1000 --tasks 1
	$(BIN)/python bench/local_load.py --instances 1000 --tasks 1 --latency --isolated

$(SAM_VENV)/bin/sam: constraints/sam.txt
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet --upgrade pip $(call lock,sam)
	$(SAM_VENV)/bin/pip install --quiet aws-sam-cli $(call lock,sam)
	@touch $@

sam: $(SAM_VENV)/bin/sam
	$(SAM_VENV)/bin/sam validate --lint --region us-east-1 -t template.yaml
	@test -n "$(PY313)" || { echo "python3.13 not found (sam build needs the runtime's Python)"; exit 1; }
	PATH=$(dir $(PY313)):$$PATH $(SAM_VENV)/bin/sam build --build-dir .aws-sam/build \
		--parameter-overrides ClusterNames=gpu-spot

$(CHECKOV_VENV)/bin/checkov: constraints/checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip $(call lock,checkov)
	$(CHECKOV_VENV)/bin/pip install --quiet checkov==$(CHECKOV_VERSION) $(call lock,checkov)
	@touch $@

# Fails on any finding that is neither fixed nor skipped with a reason (checkov:skip in Metadata).
checkov: $(CHECKOV_VENV)/bin/checkov
	CKV_SKIP_PACKAGE_UPDATE_CHECK=true $(CHECKOV_VENV)/bin/checkov --skip-download --quiet --compact \
		--framework cloudformation -f template.yaml

# The two wheels, spotguard (CLI and core) and spotguard-agent (for training images), into dist/ at the
# version in VERSION; older wheels of either are removed first.
wheels: setup
	rm -f dist/spotguard-*.whl dist/spotguard_agent-*.whl
	$(BIN)/python -m build --wheel --outdir dist .
	$(BIN)/python -m build --wheel --outdir dist agent

# The agent's packages as wheels for a GPU machine with python3 and PyTorch but no network (bench/gpu.sh
# installs them there): the versions this .venv holds, built for GPU_PYTHON on x86-64 Linux.
GPU_PYTHON ?= 3.12
GPU_WHEELS := boto3|botocore|s3transfer|jmespath|python[-_]dateutil|six|urllib3|pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|typing[-_]extensions
gpu-wheels: setup
	rm -rf .whl && mkdir -p .whl
	$(BIN)/pip freeze | grep -i -E '^($(GPU_WHEELS))==' > .whl/requirements.txt
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
	  -d .whl -r .whl/requirements.txt
	@ls .whl

# Every environment rebuilt from nothing at the newest versions (UPGRADE=1: no lock), each one's lock
# rewritten from what it now holds (constraints/freeze), then the suites that CI runs on them. Commit the
# changed constraints/ only when it ends well; `git checkout constraints/` goes back.
upgrade:
	rm -rf $(VENV) .venv-py313 $(SAM_VENV) $(CHECKOV_VENV)
	$(MAKE) UPGRADE=1 setup $(SAM_VENV)/bin/sam $(CHECKOV_VENV)/bin/checkov
	@test -n "$(PY313)" || { echo "python3.13 not found"; exit 1; }
	$(PY313) -m venv .venv-py313
	.venv-py313/bin/pip install --quiet --upgrade pip
	.venv-py313/bin/pip install --quiet -e ".[dev]" -e ./agent
	constraints/freeze $(VENV) constraints/py311.txt
	constraints/freeze .venv-py313 constraints/py313.txt
	constraints/freeze $(SAM_VENV) constraints/sam.txt
	constraints/freeze $(CHECKOV_VENV) constraints/checkov.txt
	touch $(BIN)/spotguard $(SAM_VENV)/bin/sam $(CHECKOV_VENV)/bin/checkov
	$(MAKE) test test-py313 sam checkov
	git diff --stat constraints/

events: setup
	$(BIN)/python -m spotguard_cli.emulator.inject

clean:
	rm -rf $(VENV) $(SAM_VENV) $(CHECKOV_VENV) .venv-py313 .aws-sam .local-stack .pytest_cache .ruff_cache
