"""``lightning-resume doctor --emit slurm`` on the real local SLURM: with its ``RequeueExit`` /
``RequeueExitHold`` lines in ``slurm.conf`` and its ``#SBATCH`` options, a job whose first attempt runs out
of memory (71, retryable) is requeued and the next attempt finishes; one that fails before its first step
(78, do not retry) is requeued held."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TESTS

from lightning_resume.cli import emit
from lightning_resume.failure_classes import FailureClass, exit_codes
from lightning_resume.run_dir import attempts, layout

from .conftest import CLUSTER_SH, SlurmCluster

pytestmark = pytest.mark.slurm


@pytest.fixture
def emitted(slurm: SlurmCluster) -> Iterator[str]:
    """The emitted snippet, its slurm.conf lines in force (``scontrol reconfigure``) for the test."""
    config = slurm.run("scontrol", "show", "config")
    conf = Path(re.search(r"^SLURM_CONF\s*=\s*(\S+)", config, re.MULTILINE)[1])  # type: ignore[index]
    if "Include" not in conf.read_text():  # a cluster started by an older cluster.sh: start it anew
        slurm.run("bash", str(CLUSTER_SH), "start", timeout=300)
    included = conf.parent / "requeue_exit.conf"
    before = included.read_text()
    snippet = emit.slurm()
    included.write_text("".join(f"{line}\n" for line in snippet.splitlines() if line.startswith("Requeue")))
    slurm.run("scontrol", "reconfigure")
    try:
        yield snippet
    finally:
        slurm.cancel_submitted()
        included.write_text(before)
        slurm.run("scontrol", "reconfigure")


def submit(slurm: SlurmCluster, snippet: str, tmp_path: Path, fault: str) -> tuple[str, Path, Path]:
    """The failure job, with ``fault`` in its first attempt only, under the emitted ``#SBATCH`` options."""
    root, log = tmp_path / "runs", tmp_path / "job.log"
    command = shlex.join([sys.executable, "-m", "jobs.failure_job", "--root", str(root)])
    directives = [line for line in snippet.splitlines() if line.startswith("#SBATCH")]
    script = tmp_path / "job.sh"
    script.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                *directives,
                f"cd {shlex.quote(str(TESTS))}",
                f'fault=$([ -z "$SLURM_RESTART_COUNT" ] && echo {fault} || echo none)',
                f"srun {command} --fault $fault --fault-at 1 --fault-rank 0",
                "",
            ]
        )
    )
    job = slurm.sbatch(f"--output={log}", "--ntasks=1", "--cpus-per-task=1", str(script))
    return job, root, log


def test_the_emitted_lines_are_what_slurm_reads(emitted: str, slurm: SlurmCluster) -> None:
    config = slurm.run("scontrol", "show", "config")
    assert re.search(rf"^RequeueExit\s*=\s*{','.join(map(str, exit_codes(True)))}$", config, re.MULTILINE)
    assert re.search(
        rf"^RequeueExitHold\s*=\s*{','.join(map(str, exit_codes(False)))}$", config, re.MULTILINE
    )


@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_retryable_class_is_requeued_and_the_next_attempt_finishes(
    emitted: str, slurm: SlurmCluster, tmp_path: Path
) -> None:
    job, root, log = submit(slurm, emitted, tmp_path, "oom")
    slurm.wait_sacct_state(job, "COMPLETED", timeout=480)
    record = slurm.job(job)
    assert record is None or int(record["Restarts"]) == 1, record
    (run_dir,) = layout.run_dirs(root)
    first, second = attempts.read(run_dir).attempts
    assert first.end is not None and first.end.failure == FailureClass.OUT_OF_MEMORY.value, log.read_text()
    assert first.end.exit_code == 71
    assert second.end is not None and second.end.cause is attempts.Cause.FINISHED


@pytest.mark.timeout(600)
def test_a_class_a_retry_cannot_fix_is_requeued_held(
    emitted: str, slurm: SlurmCluster, tmp_path: Path
) -> None:
    job, root, log = submit(slurm, emitted, tmp_path, "bug")
    record = slurm.wait_state(job, {"SPECIAL_EXIT"}, timeout=480)
    assert record["ExitCode"] == f"{FailureClass.DO_NOT_RETRY.exit_code}:0", record
    assert record["Reason"] == "JobHeldUser", record  # held until `scontrol release`
    (run_dir,) = layout.run_dirs(root)
    (only,) = attempts.read(run_dir).attempts
    assert only.end is not None and only.end.failure == FailureClass.DO_NOT_RETRY.value, log.read_text()
