"""``tests/jobs/retrofit_job.py`` run as a real project would be: uninterrupted once per test run, or
SIGKILLed in the middle of an epoch and relaunched, in processes of their own."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import built_once, job_env

#: The job saves every 5 steps (12 per epoch): killed after step 13, it resumes from the save of step 10.
KILL_AT = 13


def run(root: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "jobs.retrofit_job", "--root", str(root), "--out", str(out), *args]
    return subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=600)


def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of the job uninterrupted (every shape and plugin trains the same)."""

    def build(folder: Path) -> None:
        done = run(folder / "runs", folder / "ref.pt")
        assert done.returncode == 0, done.stdout + done.stderr

    return built_once(tmp_path_factory, "retrofit-reference", build) / "ref.pt"


def killed_and_relaunched(folder: Path, *args: str) -> str:
    """Run the job killed after :data:`KILL_AT`, then again to its end; the relaunch's output."""
    killed = run(folder / "runs", folder / "out.pt", "--kill-at", str(KILL_AT), *args)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    again = run(folder / "runs", folder / "out.pt", *args)
    assert again.returncode == 0, again.stdout + again.stderr
    return again.stdout + again.stderr
