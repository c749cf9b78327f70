# neuron-qwen3: every target is thin and calls one script or one command.
#
#   make venv       .venv from the three hashed locks, then this project (entrypoint + recipes) installed
#                   editable (idempotent: re-runs only when a lock changes); the wheels stay in build/wheels,
#                   so the image job needs no package index
#   make train      the launcher at smoke scale on this host (VARIANT=native|v5|nki_moe, STEPS=N, DEVICE=cpu)
#   make compare    the three variants alike (SCALE=smoke|bench, STEPS, COMPILE...), one table, one loss plot
#   make test       ruff, then the whole test suite, the image smoke job included (what CI runs), and its 10 slowest tests
#   make test-fast  ruff, then everything but the slow groups (markers `image` and `training`, pyproject.toml)
#   make ruff       the lint and the format check (pyproject.toml's [tool.ruff]); `ruff format .` applies it
#   make docs       the variant and settings tables of README.md and docs/, from the code
#   make lock       regenerate requirements*.lock from requirements*.in (needs the package index)
#   make lock-check would `make lock` give the same locks today? (needs the index; not part of `make test`)
#   make image   build the image through the docker SDK (ci/build_image.py): BASE_IMAGE=..., ARGS="--help"
#   make lint    hadolint, error threshold
#   make smoke   the CI image job locally: engine, stand-in base, image, container runs (ci/smoke.py)

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.locks-installed
# Every wheel of the three locks for this host, downloaded once by `make venv`; the stand-in base and the image
# job take theirs from here (ci/wheelhouse.py), so nothing after `make venv` needs the package index.
WHEELS := build/wheels
# Installed together into .venv; the image installs requirements.lock alone on top of its base.
LOCKS := requirements-torch.lock requirements.lock requirements-dev.lock
# What a first `make venv` writes (README, "Two commands"): checked before it downloads, so a full disk fails
# in one line instead of halfway through the install.
VENV_DISK_GB ?= 11

.PHONY: venv train compare test test-fast ruff docs lock lock-check image lint smoke clean

venv: $(STAMP)

$(STAMP): $(LOCKS) pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(None if sys.version_info >= (3, 11) else "make venv needs PYTHON >= 3.11, got " + sys.version.split()[0])'
	@test -d $(VENV) || $(PYTHON) -c 'import shutil, sys; free = shutil.disk_usage(".").free / 1e9; \
		need = f"make venv needs about $(VENV_DISK_GB) GB free in {sys.argv[1]} for $(VENV) and $(WHEELS)"; \
		sys.exit(None if free >= $(VENV_DISK_GB) else f"{need}, {free:.1f} GB are free")' "$$PWD"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip download --disable-pip-version-check --quiet --no-deps --require-hashes -d $(WHEELS) \
		$(addprefix -r ,$(LOCKS))
	$(PY) -m pip install --disable-pip-version-check --no-index --find-links $(WHEELS) --require-hashes \
		$(addprefix -r ,$(LOCKS))
	$(PY) -m pip install --disable-pip-version-check --quiet --no-index --no-deps --no-build-isolation -e .
	touch $@

# The host venv has no torch-neuronx (the locks never pin Neuron packages), so on a Neuron host the smoke job
# runs on the host's CPU (DEVICE=cpu) unless DEVICE says otherwise; elsewhere the launcher picks CUDA or CPU.
train: venv
	SCALE=$${SCALE:-smoke} DEVICE=$${DEVICE:-$$(test -e /dev/neuron0 && echo cpu || echo auto)} $(PY) -m entrypoint

compare: venv
	SCALE=$${SCALE:-smoke} $(PY) -m bench.compare --run $(ARGS)

test: ruff
	$(PY) -m pytest -q -rsxX --durations=10

test-fast: ruff
	$(PY) -m pytest -q -rsxX -m "not image and not training"

ruff: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

docs: venv
	$(PY) -m ci.docs

image: venv
	$(PY) -m ci.build_image $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE)) $(ARGS)

lint: venv
	$(VENV)/bin/hadolint --config ci/hadolint.yaml Dockerfile ci/standin/Dockerfile

smoke: venv
	$(PY) -m ci.smoke $(ARGS)

# ---------------------------------------------------------------------------------------------
# Locks. `uv pip compile --universal` with a Python floor of 3.11 writes environment markers, so
# one lock installs on Debian's Python 3.11 (dev hosts, CI, the stand-in base) and on the 2.33
# DLC's Python 3.14. --exclude-newer pins the resolution in time only where the index publishes upload times
# (PyPI does; file mirrors and proxies often don't), so whether `make lock` still reproduces the locks is a
# question for `make lock-check`, asked when updating pins, never for `make test`. Bump LOCK_DATE to update.
LOCK_DATE ?= 2026-11-30T00:00:00Z
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--exclude-newer $(LOCK_DATE) --custom-compile-command "make lock"

# requirements.lock must never install torch over the DLC's Neuron build of it. torch enters the
# closure through torchdata and torch_checkpointing (both `Requires-Dist: torch`); these are torch
# itself and the packages ONLY torch needs, all of which the base image already has (the DLC's
# torch brings them; in CI the stand-in base installs requirements-torch.lock). Packages torch
# shares with the rest (filelock, fsspec, markupsafe, setuptools, typing-extensions) stay in.
# tests/test_lock.py checks this list is exactly requirements-torch.lock minus requirements.lock.
NO_EMIT := torch triton sympy mpmath networkx jinja2 \
	cuda-bindings cuda-pathfinder cuda-toolkit \
	nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 \
	nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 \
	nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx

# Order matters: the image lock is resolved against the pinned torch; the torch and dev locks are
# then constrained by it, so a package in two locks has one version and `make venv` installs all.
# LOCK_DIR: where the locks are written (tests/test_lock.py regenerates them elsewhere and compares).
LOCK_DIR ?= .
lock: venv
	$(UV_COMPILE) requirements.in -c requirements-torch.in $(addprefix --no-emit-package ,$(NO_EMIT)) \
		-o $(LOCK_DIR)/requirements.lock
	$(UV_COMPILE) requirements-torch.in -c $(LOCK_DIR)/requirements.lock -o $(LOCK_DIR)/requirements-torch.lock
	$(UV_COMPILE) requirements-dev.in -c $(LOCK_DIR)/requirements.lock -c $(LOCK_DIR)/requirements-torch.lock \
		-o $(LOCK_DIR)/requirements-dev.lock

lock-check: venv
	$(PY) -m ci.lock_check

clean:
	rm -rf .wheelhouse build
