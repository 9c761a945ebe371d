from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_env

SCRIPT = str(Path(sys.executable).parent / "lightning-resume")


def test_demo_console_script_reports_bitwise_equal_weights() -> None:
    cmd = [SCRIPT, "demo", "--seed", "3", "--preemptions", "1"]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "final weights bitwise equal to uninterrupted run: yes" in proc.stdout


def test_demo_rejects_bad_input_with_one_line() -> None:
    proc = subprocess.run(
        [SCRIPT, "demo", "--preemptions", "99"], env=job_env(), capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--preemptions must be between" in proc.stderr


@pytest.mark.slow
def test_demo_with_trackers_shows_one_continuous_trackio_run() -> None:
    cmd = [SCRIPT, "demo", "--seed", "5", "--preemptions", "1", "--trackers"]
    proc = subprocess.run(cmd, env=job_env(HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trackio: 1 run(s)" in proc.stdout
    assert "steps 0..35 continuous; 0 step(s) logged twice" in proc.stdout
