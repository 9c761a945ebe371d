"""The reliability catalogue's shared parts: :func:`case`, which registers one row of the table in
``docs/src/troubleshooting.md`` ("What happens when..."), and the helpers the cases share.

The cases live beside the tests of the feature they are about (``tests/<feature>/test_*_bad_inputs.py``);
``tests/test_troubleshooting.py`` keeps the page and the cases in step. The catalogue only grows: a
defect found later gets a case first (failing), then its fix.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from _system import can_unshare_mounts, permission_prefix
from conftest import job_env, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import (
    DurableCheckpointIO,
    RequeueCheckpoint,
    RunDir,
)
from lightning_resume.run_dir.binding import PROCESS


@dataclass(frozen=True)
class Case:
    """One entry of the catalogue: an input or fault, what happens, and the check that it does."""

    name: str
    given: str
    outcome: str
    check: Callable[[Path], None]


CATALOGUE: list[Case] = []


def case(given: str, outcome: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    """Register the decorated check as a catalogue entry (``given`` -> ``outcome``)."""

    def register(check: Callable[[Path], None]) -> Callable[[Path], None]:
        CATALOGUE.append(Case(check.__name__, given, outcome, check))
        return check

    return register


_REQUEST: list[pytest.FixtureRequest] = []


def fit(tmp_path: Path, *callbacks: object, steps: int = 2, **trainer: object) -> None:
    """Fit BoringModel for ``steps`` steps with ``callbacks`` (a tiny CPU Trainer)."""
    options: dict[str, object] = {"max_steps": steps, "max_epochs": 3, **trainer}
    tiny_trainer(*callbacks, tmp_path=tmp_path, **options).fit(BoringModel())  # type: ignore[arg-type]


def first_run(tmp_path: Path, key: str = "k", plugin: DurableCheckpointIO | None = None) -> Path:
    """A run of session ``key`` with a committed ``last.ckpt`` at step 2; return its run dir."""
    PROCESS.reset()
    run_dir = RunDir(root=tmp_path / "root", key=key)
    fit(tmp_path, run_dir, RequeueCheckpoint(every_n_train_steps=1), plugins=[plugin] if plugin else None)
    PROCESS.reset()
    return run_dir.path


def restart(tmp_path: Path, key: str = "k", plugin: DurableCheckpointIO | None = None) -> None:
    """A restart of session ``key`` (a new process, as far as the library can tell)."""
    PROCESS.reset()
    fit(
        tmp_path,
        RunDir(root=tmp_path / "root", key=key),
        RequeueCheckpoint(every_n_train_steps=1),
        steps=4,
        plugins=[plugin] if plugin else None,
    )


def baseline_weights(loader: str) -> Path:
    """Final weights of an uninterrupted ``tests/jobs/train_job.py`` run (conftest's ``baseline``)."""
    return Path(_REQUEST[0].getfixturevalue("baseline")[loader])


def cli(*args: object) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_resume", *map(str, args)],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


def script(tmp_path: Path, body: str, *prefix: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as a Python script in its own process (optionally under ``prefix``)."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run(
        [*prefix, sys.executable, str(path)], capture_output=True, text=True, env=job_env(), timeout=timeout
    )


def under_tmpfs(tmp_path: Path, size: str, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` with a private tmpfs of ``size`` mounted at ``tmp_path/small`` (passed as argv[1])."""
    mount = tmp_path / "small"
    mount.mkdir()
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    shell = f'mount -t tmpfs -o size={size} tmpfs "{mount}" && exec "{sys.executable}" "{path}" "{mount}"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=300,
    )


needs_tmpfs = pytest.mark.skipif(not can_unshare_mounts(), reason="needs unshare -m to mount a tmpfs")


needs_permissions = pytest.mark.skipif(permission_prefix() is None, reason="cannot drop CAP_DAC_OVERRIDE")


def cases_of(module: str) -> list[Case]:
    """The cases registered by ``module`` (a test module's ``__name__``)."""
    return [c for c in CATALOGUE if c.check.__module__ == module]


def run_case(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Run one case (with the request, for checks that share the session's reference runs)."""
    _REQUEST[:] = [request]
    entry.check(tmp_path)
