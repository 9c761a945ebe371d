"""``lightning-resume doctor`` inside a real sbatch job reads the job's grace windows from SLURM itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .conftest import SlurmCluster

pytestmark = pytest.mark.slurm

DOCTOR = Path(sys.executable).parent / "lightning-resume"


def test_doctor_in_a_job_adds_kill_wait_to_the_signal_lead(slurm: SlurmCluster, tmp_path: Path) -> None:
    report = tmp_path / "doctor.json"
    script = tmp_path / "doctor.sh"
    # The lead is only in the batch script (and sacct's SubmitLine): neither scontrol show job nor the
    # job's environment has it.
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --signal=B:USR1@90\n"
        f"{DOCTOR} doctor --root {tmp_path / 'runs'} --write-test 1 --json > {report}\n"
    )
    job = slurm.sbatch("--partition=low", "--ntasks=1", f"--output={tmp_path / 'doctor.log'}", str(script))
    slurm.wait_sacct_state(job, "COMPLETED", timeout=120)
    windows = {
        f["detail"].partition(";")[0] for f in json.loads(report.read_text()) if f["check"] == "grace window"
    }
    assert windows == {
        "slurm SIGTERM: 5 s (KillWait)",
        "slurm preemption: 15 s (partition low GraceTime 10 s + KillWait)",
        "slurm SIGUSR1: 95 s (--signal lead 90 s + KillWait, to the batch shell only)",
    }
