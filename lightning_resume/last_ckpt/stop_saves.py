"""``StopSaves``: what ``PreemptionHandler`` may ask of the Trainer's ``RequeueCheckpoint``, the one
interface between ``preemption`` and ``last_ckpt`` (docs/src/architecture.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

import lightning.pytorch as pl

from lightning_resume._checks import find_one
from lightning_resume.io._protocol import hurry
from lightning_resume.last_ckpt.auto_cadence import recorded_to_durable
from lightning_resume.last_ckpt.requeue_checkpoint import RequeueCheckpoint


class StopSaves:
    """The Trainer's ``RequeueCheckpoint`` as ``needed_by`` uses it (found in its ``setup``).

    Raises:
        MissingCallbackError: without exactly one ``RequeueCheckpoint`` in the Trainer.
    """

    def __init__(self, trainer: pl.Trainer, needed_by: str) -> None:
        why = "it saves last.ckpt through it, with a RunDir"
        self._checkpoint = find_one(trainer, RequeueCheckpoint, needed_by, why)

    def at_each_epoch_boundary(self, listener: Callable[[pl.Trainer], None]) -> None:
        """Call ``listener(trainer)`` at every epoch boundary, after ``RequeueCheckpoint``'s work there."""
        if listener not in self._checkpoint._boundary_listeners:
            self._checkpoint._boundary_listeners.append(listener)

    @property
    def boundary_saved_later(self) -> bool:
        """Whether the boundary is saved after the next epoch's first batch instead: no point to stop at."""
        return self._checkpoint._exact.stateful_loaders

    def save_durably(self, trainer: pl.Trainer, in_validation: bool = False, stopping: bool = False) -> float:
        """Write ``last.ckpt`` now (every rank, at a resume point; ``in_validation``: from fit's validation;
        ``stopping``: no step follows in this attempt) and wait until it is durable; the seconds it took."""
        start, checkpoint = time.monotonic(), self._checkpoint
        hurry(trainer.strategy.checkpoint_io)  # a wait follows at once: full speed, this save at once
        if in_validation:
            checkpoint.save_in_validation(trainer)
        else:
            checkpoint.save(trainer, stopping=stopping)
        checkpoint.wait_until_durable(trainer)
        return time.monotonic() - start

    def recorded_to_durable(self) -> float | None:
        """The longest time to durable of the run's newest attempt that measured one (``None``: none did)."""
        return recorded_to_durable(self._checkpoint._run())
