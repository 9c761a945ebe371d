"""The SLURM time limit as a notice, on the real local cluster: a job whose training outlasts its
``--time`` saves, requeues itself before the limit (never ``TIMEOUT``) and completes exactly."""

from __future__ import annotations

import ast
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import JOB_MODULE, same_weights, uninterrupted

from .conftest import SlurmCluster

pytestmark = pytest.mark.slurm

# One epoch of 12 steps of 6 s: 72 s of training, more than the one-minute limit of an attempt. The
# saves every 2 steps measure the time to durable (without any, 30 s are assumed).
JOB = ("--epochs", "1", "--every", "2")
SLOW = ("--preemption", "--durable", "--step-sleep", "6", "--notice-margin", "5")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final weights of the same job, uninterrupted and outside SLURM."""
    return uninterrupted(tmp_path_factory, "notices-slurm-reference", *JOB, timeout=180)


PROBE = """
import time
from lightning_resume.notices import SlurmTimeLimitNotice
source = SlurmTimeLimitNotice()
deadline = time.monotonic() + 75  # past SIGNAL_READ_SECONDS: settled by then, either way
while time.monotonic() < deadline:  # a job that just started may not be in the accounting yet
    notice = source.poll()  # until it is, the time limit counts
    if source.signal_known:
        break
    time.sleep(0.5)
signal = source.warning_signal()
signal = (signal.name, signal.lead) if signal else None
print("PROBE", repr((source.applies(), signal, source.last_error, notice and notice.deadline)))
"""


def test_the_time_limit_is_read_and_a_job_with_its_own_warning_signal_gets_no_notice(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    jobs = {}
    for name, options in (("plain", ()), ("signal", ("--signal=USR1@50",))):
        script = tmp_path / f"{name}.sh"
        script.write_text(f"#!/bin/bash\nexec {shlex.quote(sys.executable)} {tmp_path / 'probe.py'}\n")
        log = tmp_path / f"{name}.log"
        jobs[name] = (slurm.sbatch(f"--output={log}", "--time=2", *options, script), log)
    for name, (job, log) in jobs.items():
        slurm.wait_sacct_state(job, "COMPLETED", timeout=150)
        (line,) = [line for line in log.read_text().splitlines() if line.startswith("PROBE ")]
        applies, warning, error, deadline = ast.literal_eval(line.removeprefix("PROBE "))
        assert applies and error is None, line
        if name == "plain":
            assert warning is None and deadline > 0, line  # the end time: a notice
        else:
            assert warning == ("SIGUSR1", 50.0) and deadline is None, line  # SLURM's own warning instead


@pytest.mark.slow
def test_a_job_at_its_time_limit_saves_requeues_itself_before_it_and_completes_exactly(
    slurm: SlurmCluster, tmp_path: Path, reference: Path
) -> None:
    out, log = tmp_path / "out.pt", tmp_path / "job.log"
    command = [
        sys.executable,
        "-m",
        JOB_MODULE,
        "--root",
        str(tmp_path / "runs"),
        "--out",
        str(out),
        *JOB,
        *SLOW,
    ]
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nexec srun " + shlex.join(command) + "\n")
    # Notices() (PreemptionHandler's default, "auto") finds the time limit: the job is on SLURM.
    job = slurm.sbatch(
        "--requeue",
        "--open-mode=append",
        f"--output={log}",
        "--ntasks=1",
        "--cpus-per-task=1",
        "--time=1",
        script,
    )
    slurm.wait_sacct_state(job, "COMPLETED", timeout=420)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "preemption notices polled here: slurm-time-limit" in text, text[-3000:]
    stops = re.findall(
        r"Preempted by the slurm-time-limit notice at step (\d+): .*; requeue: scontrol requeue "
        + job
        + r";.*the last save durable ([\d.]+) s before the deadline",
        text,
    )
    assert stops, text[-3000:]  # at least one stop before the limit; a loaded machine may need two
    assert all(float(before) > 0 for _, before in stops)
    restarts = slurm.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State").split()
    assert "TIMEOUT" not in restarts and len(restarts) == len(stops) + 1, restarts
    assert same_weights(out, reference)
