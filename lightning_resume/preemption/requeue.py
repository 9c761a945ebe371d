"""Requeue this job once, the way it was launched: shared by the preemption and the hang paths.

SLURM: ``scontrol requeue`` (``ARRAYJOB_TASK`` for array tasks), skipped when the job is no longer
``RUNNING`` (the scheduler is already requeueing it). submitit: its own preempt handler first, when
the caller has one to give. torchrun: none while the agent still has restarts to give (it restarts the
workers when one exits non-zero). Anything else: none, the non-zero exit is the launcher's cue.

Nothing here logs: the hang path runs on a watchdog thread while the main thread may hold a logging
lock, so problems are handed to ``warn`` (when given) and said in the returned line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lightning_resume._scheduler import slurm
from lightning_resume._scheduler.environment import ENV, slurm_requeue_id

#: torchrun's count of the restarts it allows (it sets it for its workers).
ELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"


def requeue_job(
    environ: Mapping[str, str],
    via_submitit: Callable[[], object] | None = None,
    warn: Callable[[str], None] | None = None,
    timeout: float = 60,
) -> str:
    """Requeue the job once; return what was done, in one line.

    Args:
        environ: The environment (the SLURM ids).
        via_submitit: Calls submitit's preempt handler, which requeues and exits (``SystemExit``
            passes through); on any other error the SLURM path below runs.
        warn: Told about a requeue that failed (the same text ends the returned line).
        timeout: Seconds each SLURM command may take.

    Example::

        requeue_job(os.environ)  # "scontrol requeue 4242", or "none (not a SLURM job)"
    """
    if via_submitit is not None:
        try:
            via_submitit()
        except SystemExit:
            raise
        except Exception as e:  # reported; the SLURM fallback below runs
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
        allowed = int(environ.get(ELASTIC_MAX_RESTARTS, "0") or 0)
    except ValueError:
        return 0
    return max(allowed - done, 0)


def requeue_after_hang(environ: Mapping[str, str], timeout: float = 15) -> str:
    """Requeue a hung job once: leave it to torchrun while it restarts workers, else as :func:`requeue_job`.

    submitit's handler is not used: it runs the job's ``checkpoint()`` and exits the calling thread,
    neither of which a hung process can afford; the SLURM requeue reruns submitit's job the same way.
    """
    left = torchrun_restarts_left(environ)
    if left:
        return f"none: torchrun restarts the workers ({left} restart(s) left)"
    return requeue_job(environ, timeout=timeout)
