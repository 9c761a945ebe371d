"""``lightning-resume demo``: ``check`` on the example that ships in the package, run as installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_env

SCRIPT = str(Path(sys.executable).parent / "lightning-resume")


def demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, "demo", *args], env=job_env(), capture_output=True, text=True, timeout=1500, cwd=cwd
    )


@pytest.mark.long
@pytest.mark.timeout(1200)  # four launches of a real training job
def test_demo_checks_the_bundled_example_and_finds_it_exact(tmp_path: Path) -> None:
    # Right after an epoch-end save: the restart logs the next epoch's learning rate (LearningRateMonitor,
    # listed before RequeueCheckpoint's LocalLoggerResume) after its cut of the logs, not before.
    proc = demo(tmp_path, "--points", "after-epoch-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exact in 1 of 1 scenarios" in proc.stdout
    assert "[1/1] after-epoch-save: 2 attempts" in proc.stderr  # a progress line while it runs
    assert "after-epoch" in proc.stdout and "SIGKILL" in proc.stdout  # the table
    assert list(tmp_path.iterdir()) == []  # nothing left where it ran, its folder removed


def test_demo_rejects_bad_input_with_one_line(tmp_path: Path) -> None:
    proc = demo(tmp_path, "--points", "everywhere")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown --points everywhere" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_demo_at_every_point_is_exact(tmp_path: Path) -> None:
    proc = demo(tmp_path, "--kills", "2", "--seed", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exact in 7 of 7 scenarios" in proc.stdout
