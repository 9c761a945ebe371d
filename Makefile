# Developer entry points for lightning-resume.
#
#   make venv       create .venv and install torch + the package (editable, all extras)
#   make demo       run the preemption/resume demo
#   make lint       ruff check
#   make typecheck  mypy (config in pyproject.toml)
#   make test       lint + typecheck + pytest   (what CI runs, via .ci/run)
#   make test-edge  the exactness core again, on the lowest Lightning, pytorch_lightning and torch declared
#                   (a second venv, .venv-edge; .ci/run runs it after make test)
#   make test-gpu   the GPU checks (tests/gpu; skipped without a CUDA device)
#   make clean      remove .venv, build artefacts and tool caches
#
# torch is installed *before* the package on purpose: resolving the open range
# `torch>=2.5` in an empty venv pulls a multi-GB CUDA build.  Override TORCH_SPEC to
# use your own build, or set it empty to skip this step, e.g.
#   make venv TORCH_SPEC='torch==2.5.1' TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'
#   make venv TORCH_SPEC=

PY             ?= python3
VENV           := .venv
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_ARGS    ?=
# pytest-xdist workers (0: one process). Most tests wait on subprocess jobs, SLURM's scheduler or a
# watchdog's timeout; three keep 2 cores busy.
PYTEST_WORKERS ?= 3

BIN   := $(VENV)/bin
PIP   := $(BIN)/python -m pip
# Re-install only when the packaging metadata changes.
STAMP := $(VENV)/.stamp

# Only lint directories that exist (benchmarks/ may not yet).
LINT_PATHS := $(wildcard lightning_resume tests benchmarks docs)

# Keep loggers/hubs from touching the network during tests.
TEST_ENV := WANDB_MODE=offline WANDB_SILENT=true SWANLAB_MODE=offline HF_HUB_OFFLINE=1

# The lowest versions declared in pyproject.toml (and lightning_resume/_compat/versions.py), with the
# torchdata that goes with that torch.
EDGE_VENV := .venv-edge
EDGE_SPEC ?= torch==2.5.1 lightning==2.5.0.post0 pytorch-lightning==2.5.0.post0 torchdata==0.10.1

.PHONY: venv demo lint typecheck test test-edge test-gpu test-multinode clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifneq ($(strip $(TORCH_SPEC)),)
	$(PIP) install -q "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
endif
	$(PIP) install -q -e ".[all,dev]"
	touch $@

demo: venv
	$(BIN)/lightning-resume demo

lint: venv
	$(BIN)/ruff check $(LINT_PATHS)

typecheck: venv
	$(BIN)/mypy

test: venv lint typecheck
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -f docs/mkdocs.yml
# The tests marked `slurm` run against a real single-node SLURM cluster on this machine
# (needs root and apt; idempotent, ~2 s when already installed). Stop it with
# `bash tests/slurm/cluster.sh stop`.
	bash tests/slurm/cluster.sh start
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The tests marked `edge` (the internals pins, random kills with plain and stateful loaders, a kill right
# after an epoch-end save, accumulation, DDP, the standalone package) on the lowest versions declared.
test-edge:
	test -x $(EDGE_VENV)/bin/python || $(PY) -m venv $(EDGE_VENV)
	$(EDGE_VENV)/bin/python -m pip install -q --upgrade pip
	$(EDGE_VENV)/bin/python -m pip install -q $(EDGE_SPEC)
	$(EDGE_VENV)/bin/python -m pip install -q -e ".[data,tensorboard,standalone]" $(EDGE_SPEC) \
		"pytest>=8,<9" pytest-timeout "pytest-xdist>=3.5" pyyaml
	$(TEST_ENV) $(EDGE_VENV)/bin/python -m pytest -q -m "edge and not slow" -n $(PYTEST_WORKERS) --dist loadgroup -p no:cacheprovider $(PYTEST_ARGS)

# Everything in tests/gpu, slow cases included; the cases marked `gpu` need a CUDA device.
test-gpu: venv
	$(TEST_ENV) $(BIN)/python -m pytest -q -rs tests/gpu $(PYTEST_ARGS)

# The tests marked `multinode` (tests/cluster, ~2 min, plus ~2.5 min for SLURM): a real cluster of Linux
# namespace nodes on this machine (own network on a private bridge, hostname, /tmp, /dev/shm), torchrun
# and Lightning's own multi-node launch, a node lost and replaced. Needs root, iproute2 and util-linux;
# run serially. test_slurm_nodes.py runs a SLURM of its own over the nodes (tests/cluster/slurm_nodes.py:
# one slurmd per node, slurmctld and munged here, its own slurm.conf, ports 6837/6838; not
# tests/slurm/cluster.sh's, which may run meanwhile): `sbatch -N 2` under srun, `scontrol requeue`, a
# node lost and set DOWN. It apt-get installs slurmd, slurmctld, slurm-client and munge when missing.
test-multinode: venv
	command -v ip >/dev/null && command -v nsenter >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 util-linux)
	$(TEST_ENV) $(BIN)/python -m pytest -q -rs tests/cluster $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(EDGE_VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
