# Developer entry points for lightning-resume.
#
#   make venv       create .venv and install torch + the package (editable, all extras)
#   make demo       run the preemption/resume demo
#   make lint       ruff check
#   make typecheck  mypy (config in pyproject.toml)
#   make test       lint + typecheck + pytest   (what CI runs, via .ci/run)
#   make test-long  the end-to-end cases make test leaves out for time (CI runs them too)
#   make test-edge  the exactness core again, on the lowest Lightning, pytorch_lightning and torch declared
#                   (a second venv, .venv-edge; .ci/run runs it after make test)
#   make test-gpu   the GPU checks (tests/gpu; skipped without a CUDA device)
#   make test-wheel the sdist and wheel built and checked, the wheel installed in a clean venv and run from
#                   outside the checkout (.venv-wheel)
#   make test-pythons  the exactness core on every declared Python this machine has (.venv-py3.X)
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
# What the exactness core needs besides torch (make test-edge, make test-pythons), and how it runs.
EDGE_DEPS := -e ".[data,tensorboard,standalone]" "pytest>=8,<9" pytest-timeout "pytest-xdist>=3.5" pyyaml \
	"jsonargparse[signatures]>=4.27"
EDGE_PYTEST = -q -m "edge and not slow" -n $(PYTEST_WORKERS) --dist loadgroup -p no:cacheprovider $(PYTEST_ARGS)
# On the other Pythons: the same core less the `heavy` cases (multi-rank and multi-kill variants).
PYTHONS_PYTEST = -q -m "edge and not slow and not heavy and not long" -n $(PYTEST_WORKERS) --dist loadgroup -p no:cacheprovider $(PYTEST_ARGS)

WHEEL_VENV := .venv-wheel
# Declared Pythons test-pythons leaves out (CI: the .venv's, which make test ran the whole suite on).
SKIP_PYTHONS ?=

.PHONY: venv demo lint typecheck test test-long test-edge test-gpu test-multinode test-wheel test-pythons clean

venv: $(STAMP)

$(STAMP): pyproject.toml lightning_resume/_version.py
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
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slow and not heavy and not long" -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The end-to-end cases marked `long`: left out of `make test` to keep it within 15 minutes on 2 cores,
# run by CI right after it (.ci/run). Each is a variant or a second path of something make test covers.
test-long: venv
	bash tests/slurm/cluster.sh start
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "long and not slow and not heavy" -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The tests marked `edge` (the internals pins, random kills with plain and stateful loaders, a kill right
# after an epoch-end save, accumulation, DDP, the standalone package, LightningCLI's YAML) on the lowest
# versions declared.
test-edge:
	test -x $(EDGE_VENV)/bin/python || $(PY) -m venv $(EDGE_VENV)
	$(EDGE_VENV)/bin/python -m pip install -q --upgrade pip
	$(EDGE_VENV)/bin/python -m pip install -q $(EDGE_SPEC)
	$(EDGE_VENV)/bin/python -m pip install -q $(EDGE_DEPS) $(EDGE_SPEC)
	$(TEST_ENV) $(EDGE_VENV)/bin/python -m pytest $(EDGE_PYTEST)

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

# The sdist and the wheel, built and checked (tests/packaging/check_dist.py, into dist/), then the wheel
# (no extras) installed into a clean venv, torch first, and run from an empty directory outside the
# checkout: doctor, demo and a kill-and-resume job (tests/packaging/run_installed.py).
test-wheel: venv
	$(BIN)/python tests/packaging/check_dist.py dist
	rm -rf $(WHEEL_VENV)
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --upgrade pip
ifneq ($(strip $(TORCH_SPEC)),)
	$(WHEEL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
endif
	$(WHEEL_VENV)/bin/python -m pip install -q dist/*.whl
	$(BIN)/python tests/packaging/run_installed.py $(WHEEL_VENV)

# The exactness core (what test-edge runs, on the newest versions) on every Python pyproject.toml declares
# that this machine has: pyenv's versions folder, then python3.X on the PATH; a line for each one absent.
# One venv each (.venv-py3.X, kept), TORCH_SPEC first. tests/packaging/pythons.py prints the results.
test-pythons: venv
	$(BIN)/python tests/packaging/pythons.py --skip "$(SKIP_PYTHONS)" --torch "$(TORCH_SPEC)" \
		--skip-reason "left out by SKIP_PYTHONS (in CI: the .venv's Python, which make test ran)" \
		--torch-pip-args "$(TORCH_PIP_ARGS)" --deps '$(EDGE_DEPS)' -- $(PYTHONS_PYTEST)

clean:
	rm -rf $(VENV) $(EDGE_VENV) $(WHEEL_VENV) .venv-py3.* build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
