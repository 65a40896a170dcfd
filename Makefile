# kernelperf: `make install` then `make test` on any machine; `make test-gpu` on a GPU.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOBS ?= auto
# The project's venv where `make install` made one, else the machine's python3
# (the GPU machine's python3 already has jax, torch and triton).
PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
BASE ?= main

.PHONY: install test lint pytest test-gpu cuda list bench bench-compare dashboard clean

install: $(VENV)/.installed

# torch==2.13.0 is pinned before the project so pip takes the CPU build where
# one is provided (a range would let pip choose a multi-GB CUDA build).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 triton==3.6.0
	$(BIN)/python -m pip install --quiet -e '.[dev,triton]'
	touch $@

test: install lint pytest

lint: install
	$(BIN)/ruff check .

pytest: install
	$(BIN)/python -m pytest -n $(JOBS)

# On a GPU machine whose python3 already has jax[cuda], torch and triton.
test-gpu:
	$(PYTHON) -m pytest -m gpu -n 0

# On a host with several GPUs: the sharded ops, then how much communication the
# collective matmul hides.
.PHONY: test-multi-gpu overlap
test-multi-gpu:
	$(PYTHON) -m pytest -m multi_gpu -n 0

overlap:
	$(PY) -m kernels.ops.sharded_matmul.overlap

list:
	$(PY) -m kernels list

# asv on HEAD; results go to .asv/results/<device model>/.
bench:
	$(PY) -m kernels bench

# asv on $(BASE) and HEAD, then a verdict per row; exits 1 if HEAD is slower.
bench-compare:
	$(PY) -m kernels bench --base $(BASE)

dashboard:
	$(PY) -m asv publish
	$(PY) -m asv preview

# Compile every CUDA kernel (kernels/ops/*/*.cu) into the build cache: for the GPU present,
# else for sm_90a. Needs only nvcc and Python's standard library (torch, if present, names the GPU).
cuda:
	$(PYTHON) -m kernels.cuda.build

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info .asv
