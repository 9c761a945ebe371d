"""A hung job on the real local SLURM cluster: ``ProgressWatchdog`` requeues it once; the rerun ends exact."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_env, same_weights

from lightning_resume.run_dir import attempts, layout

from .conftest import SlurmCluster

pytestmark = pytest.mark.slurm

JOB = "jobs.watchdog_job"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("watchdog-slurm-ref")
    command = [sys.executable, "-m", JOB, "--root", str(folder / "runs"), "--out", str(folder / "ref.pt")]
    proc = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder / "ref.pt"


def test_a_hung_job_is_requeued_once_and_resumes_exactly(
    slurm: SlurmCluster, tmp_path: Path, reference: Path
) -> None:
    root, out, log = tmp_path / "runs", tmp_path / "job.pt", tmp_path / "job.log"
    command = [sys.executable, "-m", JOB, "--root", str(root), "--out", str(out)]
    command += ["--hang", "step", "--hang-at", "5", "--min-timeout", "4", "--first-step-timeout", "120"]
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nexec srun " + shlex.join(command) + "\n")
    job = slurm.sbatch(
        "--requeue", "--open-mode=append", f"--output={log}", "--ntasks=1", "--cpus-per-task=1", str(script)
    )
    slurm.wait_sacct_state(job, "COMPLETED", timeout=240)
    text = log.read_text()
    assert f"ProgressWatchdog: requeue: scontrol requeue {job}" in text, text[-3000:]
    record = slurm.job(job)
    if record is not None:
        assert int(record.get("Restarts", 0)) == 1  # requeued once
    else:  # slurmctld forgot the job: accounting has one line per run
        states = slurm.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State").split()
        assert len(states) == 2, states
    (run_dir,) = layout.run_dirs(root)
    first, second = attempts.read(run_dir).attempts
    assert first.end is not None and first.end.cause is attempts.Cause.HUNG and first.end.step == 5
    assert second.resumed_from == 4 and second.end is not None and second.end.cause is attempts.Cause.FINISHED
    assert same_weights(out, reference)
