"""Errors raised by lightning_resume. Each message says what is wrong and what to do."""

from __future__ import annotations


class RunDirError(RuntimeError):
    """The run directory for this job cannot be decided without risking a lost or mixed-up run."""


class ResumeError(RuntimeError):
    """A restarted job cannot resume, and starting fresh would silently discard the run."""


class Preempted(SystemExit):
    """Raised to end ``fit`` after a preemption signal, once ``last.ckpt`` is durable.

    It is a ``SystemExit`` so the process ends with :attr:`code`, a non-zero status that schedulers
    (SLURM, torchrun, Kubernetes, submitit) read as "not finished".
    """
