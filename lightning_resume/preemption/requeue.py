"""Requeue this job once, the way it was launched (preemption and hang paths). Nothing here logs: the hang
path runs on a watchdog thread while the main thread may hold a logging lock."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lightning_resume._scheduler import slurm
from lightning_resume._scheduler.environment import ENV, slurm_requeue_id


def requeue_job(
    environ: Mapping[str, str],
    via_submitit: Callable[[], object] | None = None,
    warn: Callable[[str], None] | None = None,
    timeout: float = 60,
) -> str:
    """Requeue the job once (``scontrol requeue`` unless no longer ``RUNNING``); return what was done.
    ``via_submitit``: submitit's preempt handler (requeues and exits); ``warn``: told of a failure."""
    if via_submitit is not None:
        try:
            via_submitit()
        except Exception as e:  # not SystemExit: reported, and the SLURM fallback below runs
            if warn is not None:
                warn(f"submitit's requeue failed ({e!r}); falling back to scontrol")
    job = slurm_requeue_id(environ)
    if job is None:
        return "none (not a SLURM job)"
    state = slurm.slurm_job_state(job, timeout=timeout)
    if state is not None and state != "RUNNING":
        return f"none: job {job} is already {state} (the scheduler is requeueing it)"
    try:
        return slurm.scontrol_requeue(job, timeout=timeout)
    except RuntimeError as e:
        if warn is not None:
            warn(str(e))
        return f"failed: {e}"


def torchrun_restarts_left(environ: Mapping[str, str]) -> int | None:
    """How many more times torchrun's agent restarts the workers (``None``: not under torchrun)."""
    if not environ.get(ENV["elastic_run"]):
        return None
    try:
        done = int(environ.get(ENV["elastic_restart"], "0") or 0)
        allowed = int(environ.get(ENV["elastic_max_restarts"], "0") or 0)
    except ValueError:
        return 0
    return max(allowed - done, 0)


def requeue_after_hang(environ: Mapping[str, str], timeout: float = 15) -> str:
    """Requeue a hung job once: left to torchrun while it restarts workers, else through SLURM."""
    # Not submitit's handler: its checkpoint() and thread exit are what a hung process cannot afford (the
    # SLURM requeue reruns submitit's job the same way).
    left = torchrun_restarts_left(environ)
    if left:
        return f"none: torchrun restarts the workers ({left} restart(s) left)"
    return requeue_job(environ, timeout=timeout)
