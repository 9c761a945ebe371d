"""SLURM commands a job runs on itself: requeue it, and read its state and its settings."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence


def scontrol_requeue(job: str, timeout: float = 60) -> str:
    """Run ``scontrol requeue JOB``; returns what happened, in one line (``RuntimeError`` says what to do)."""
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
    out = slurm_output(["scontrol", "-o", "show", "job", job], timeout=timeout) or ""
    for field in out.split():
        if field.startswith("JobState="):
            return field.partition("=")[2]
    return None


def slurm_output(command: Sequence[str], timeout: float = 5, path: str | None = None) -> str | None:
    """The standard output of ``command`` (looked up on ``path``), or ``None`` when it is missing, fails
    or takes over ``timeout`` seconds: for checks that have a fallback."""
    exe = shutil.which(command[0], path=path)
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, *command[1:]], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    return proc.stdout if proc.returncode == 0 else None
