from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import job_env

SCRIPT = str(Path(sys.executable).parent / "lightning-resume")


def test_demo_console_script_reports_bitwise_equal_weights() -> None:
    cmd = [SCRIPT, "demo", "--seed", "3", "--preemptions", "2"]
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
