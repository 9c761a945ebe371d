"""Shared fixtures: a clean environment and signal table per test, and a runner for the demo job.

``make test`` runs the suite on three pytest-xdist workers (``--dist loadgroup``). What must not be split
across them is grouped here, in :func:`pytest_collection_modifyitems`; what both may need is built once
for the whole run by :func:`built_once`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_resume._storage.catalog import Status, check_file
from lightning_resume.run_dir.binding import PROCESS

TESTS = Path(__file__).resolve().parent
#: The end-to-end tests' training job (``tests/jobs/train_job.py``), run with ``python -m``.
JOB_MODULE = "jobs.train_job"
SCHEDULER_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LIGHTNING_RESUME_KEY",
    "LIGHTNING_RESUME_RUN_DIR",
    # What `doctor`'s grace window reads.
    "LIGHTNING_RESUME_GRACE_SECONDS",
    "SLURM_JOB_PARTITION",
    "SBATCH_SIGNAL",
    "PET_SHUTDOWN_TIMEOUT",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "KUBERNETES_SERVICE_HOST",
    # What the notice sources read (lightning_resume.notices).
    "SLURM_JOB_END_TIME",
    "LIGHTNING_RESUME_NOTICE",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group the tests that must run on one pytest-xdist worker (no effect without ``--dist loadgroup``).

    ``tryfirst``: pytest-xdist reads the groups in a hook of its own, which would otherwise run first.
    (Under pytest 9 its groups are ignored altogether: ``pyproject.toml`` keeps pytest below 9.)

    - Every ``slurm`` test: there is one cluster of one node, and each test expects it idle.
    - The tests of a module that has a module- or session-scoped fixture of its own (a reference run,
      a moto server, a submitted job): on two workers it would be built twice.
    """
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
            continue
        fixtures = getattr(item, "_fixtureinfo", None)  # what the test requests (pytest's own record)
        module = item.nodeid.split("::", 1)[0]
        defs = fixtures.name2fixturedefs.values() if fixtures is not None else ()
        if any(d.scope in ("module", "session") and d.baseid == module for chain in defs for d in chain):
            item.add_marker(pytest.mark.xdist_group(module))


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build`` fills once per test run, shared by all pytest-xdist workers.

    The first worker to ask builds it under a lock in the run's common temporary folder; the others
    wait for it and reuse it. A build that fails leaves nothing behind, so the next caller retries.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / f"built-once-{name}"
    with open(shared / f"built-once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            (folder / ".built").touch()
    return folder


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts outside any scheduler and gets its env vars and signal handlers back."""
    for var in SCHEDULER_VARS:
        monkeypatch.delenv(var, raising=False)
    saved_env = dict(os.environ)
    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
    }
    PROCESS.reset()  # each test is a new job: no run dir announced by an earlier test
    yield
    PROCESS.reset()
    os.environ.clear()
    os.environ.update(saved_env)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def job_env(**extra: str | int | None) -> dict[str, str]:
    """The environment for a job subprocess: this one without scheduler vars, plus ``extra``.

    ``tests/`` is on ``PYTHONPATH`` so that jobs can run ``python -m jobs.train_job``.
    """
    env = {k: v for k, v in os.environ.items() if k not in SCHEDULER_VARS}
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


@dataclass
class Attempt:
    returncode: int
    output: str
    run_dir: Path | None


def run_job(
    root: Path, out: Path, *args: str | int, timeout: float = 180, **env: str | int | None
) -> Attempt:
    """Run ``python -m jobs.train_job`` once and return its exit status and output."""
    cmd = [
        sys.executable,
        "-m",
        JOB_MODULE,
        "--root",
        str(root),
        "--out",
        str(out),
        *map(str, args),
    ]
    # A session of its own: a kill of the job's process group (all DDP ranks) spares pytest.
    proc = subprocess.run(
        cmd, env=job_env(**env), capture_output=True, text=True, timeout=timeout, start_new_session=True
    )
    meta = Path(f"{out}.json")
    run_dir = (
        Path(json.loads(meta.read_text())["run_dir"]) if proc.returncode == 0 and meta.exists() else None
    )
    return Attempt(proc.returncode, proc.stdout + proc.stderr, run_dir)


def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory, name: str, *args: str | int, timeout: float = 240
) -> Path:
    """The final weights of ``train_job`` run with ``args`` once, uninterrupted (built once per test run)."""

    def build(folder: Path) -> None:
        attempt = run_job(folder / "runs", folder / "ref.pt", *args, timeout=timeout)
        assert attempt.returncode == 0, attempt.output

    return built_once(tmp_path_factory, name, build) / "ref.pt"


def same_weights(a: Path, b: Path) -> bool:
    left, right = torch.load(a), torch.load(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def held_step(path: Path) -> int:
    """The step of the version of the checkpoint ``path`` its bytes match. A kill inside a commit or an
    upload leaves the manifest's new entry ahead of the bytes still in place: a restore takes the
    version they match (the fallback entry)."""
    verdict = check_file(path)
    assert verdict.status is Status.VERIFIED and verdict.manifest is not None, verdict
    assert verdict.manifest.global_step is not None
    return int(verdict.manifest.global_step)


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Final weights of uninterrupted runs, by loader kind, computed once per test run."""
    loaders = ("stateful", "plain")

    def build(folder: Path) -> None:
        for loader in loaders:
            attempt = run_job(folder / loader, folder / f"{loader}.pt", "--loader", loader)
            assert attempt.returncode == 0, attempt.output

    folder = built_once(tmp_path_factory, "baseline", build)
    return {loader: folder / f"{loader}.pt" for loader in loaders}


def tiny_trainer(*callbacks: pl.Callback, tmp_path: Path, **kwargs: object) -> pl.Trainer:
    """A quiet CPU Trainer for one short epoch of ``BoringModel`` (4 batches, no validation)."""
    options = dict(
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    options.update(kwargs)
    return pl.Trainer(callbacks=list(callbacks), **options)  # type: ignore[arg-type]
