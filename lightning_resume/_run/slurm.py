"""SLURM commands a job runs on itself: requeue it, and read its state."""

from __future__ import annotations

import shutil
import subprocess


def scontrol_requeue(job: str, timeout: float = 60) -> str:
    """Run ``scontrol requeue JOB``; return what happened, in one line.

    Raises:
        RuntimeError: ``scontrol`` is missing or fails; the message says what to do.
    """
    exe = shutil.which("scontrol")
    if exe is None:
        raise RuntimeError(
            f"Cannot requeue SLURM job {job!r}: 'scontrol' is not on PATH. Put SLURM's bin directory on PATH "
            "in the job script, or requeue the job by hand."
        )
    try:
        proc = subprocess.run([exe, "requeue", job], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"'scontrol requeue {job}' did not answer within {timeout:.0f} s.") from e
    if proc.returncode != 0:
        raise RuntimeError(f"'scontrol requeue {job}' failed ({proc.returncode}): {proc.stderr.strip()}")
    return f"scontrol requeue {job}"


def slurm_job_state(job: str, timeout: float = 30) -> str | None:
    """``JobState`` of a SLURM job from ``scontrol show job``, or ``None`` if it cannot be read."""
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "-o", "show", "job", job], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None
    for field in proc.stdout.split():
        if field.startswith("JobState="):
            return field.partition("=")[2]
    return None
