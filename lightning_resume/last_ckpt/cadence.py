"""When ``last.ckpt`` is due by steps (one comparison per batch; ``"auto"``: ``auto_cadence``) or minutes,
and :class:`SaveTimer`, the one timer of its saves."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl

from lightning_resume._checks import is_number, positive_number, whole_number
from lightning_resume._collectives import broadcast
from lightning_resume.io._protocol import ReportsWrites
from lightning_resume.last_ckpt.auto_cadence import AutoCadence
from lightning_resume.run_dir.attempt_recorder import AttemptRecorder

AUTO = "auto"


def checked_interval(value: Any) -> int | str | None:
    """``every_n_train_steps``: a whole number >= 1, ``"auto"`` or ``None`` (else TypeError/ValueError)."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, str):  # "5" stays a wrong type, as before "auto" existed
        raise TypeError(
            f"every_n_train_steps must be a whole number of steps, 'auto' or None, got {value!r}."
        )
    return whole_number("every_n_train_steps", value, 1, "whole number of steps, 'auto' or None")


def checked_seconds(value: Any) -> float | None:
    """``expected_interruption_every`` in seconds, from a ``timedelta``, a number of seconds or ``None``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif not is_number(value):
        raise TypeError(
            f"expected_interruption_every must be a timedelta, a number of seconds or None, got {value!r}."
        )
    return positive_number("expected_interruption_every", value, "timedelta or number of seconds")


class SaveTimer:
    """Times every save of ``last.ckpt`` (every rank): its stall and its time to durable (once its background
    write commits, if any); rank 0 records both in the attempt."""

    def __init__(self) -> None:
        self.last_saved = time.monotonic()  # when the newest save ended (construction before any)
        self._record: AttemptRecorder | None = None
        self._save: tuple[float, object] | None = None  # the save in progress: start, the last write
        self._source: ReportsWrites | None = None  # what says when the newest save is durable
        self.writing: tuple[float, object] | None = None  # a background write: its save's stall, last write

    def start(self, trainer: pl.Trainer, record: AttemptRecorder) -> None:
        """At the start of training (``record``: rank 0's is written)."""
        self._record = record if trainer.is_global_zero else None
        self._save = self._source = self.writing = None

    def saving(self, trainer: pl.Trainer, writer: object = None) -> None:
        """A save begins; ``writer`` writes it where the plugin does not (the sharded saver)."""
        source = writer if writer is not None else trainer.strategy.checkpoint_io
        self._source = source if isinstance(source, ReportsWrites) else None
        self._save = (time.monotonic(), self._source.last_write if self._source is not None else None)

    def saved(self) -> tuple[float, float | None] | None:
        """The save returned: its stall and time to durable (``None``: in the background), if one began."""
        if self._save is None:
            return None
        (started, before), self._save = self._save, None
        self.last_saved = time.monotonic()
        stall = self.last_saved - started
        background = self._source is not None and self._source.last_write is before
        self.writing = (stall, before) if background else None  # committed later, by the writer
        to_durable = None if background else stall  # written (and fsynced) before save returned
        if self._record is not None:
            self._record.saved_last_ckpt(stall=stall, to_durable=to_durable)
        return stall, to_durable

    def written(self) -> float | None:
        """The time to durable of the newest save, once its background write is done (else ``None``)."""
        write = self._source.last_write if self._source is not None else None
        if self.writing is None or write is None or write is self.writing[1]:
            return None
        to_durable, self.writing = self.writing[0] + write.seconds, None
        if self._record is not None:
            self._record.saved_last_ckpt(to_durable=to_durable)
        return to_durable


class Cadence:
    """When ``RequeueCheckpoint`` saves: every :attr:`fixed` steps or ``"auto"``, and by minutes."""

    def __init__(
        self, every_n_train_steps: int | str | None, every_n_minutes: float | None, expected: float | None
    ) -> None:
        self.fixed = every_n_train_steps if isinstance(every_n_train_steps, int) else None
        self.auto = AutoCadence(expected) if every_n_train_steps == AUTO else None
        self.minutes = every_n_minutes
        self.timer = SaveTimer()

    def start(self, trainer: pl.Trainer, record: AttemptRecorder) -> None:
        self.timer.start(trainer, record)
        if self.auto is not None:
            self.auto.start(trainer, record)

    def saved(self) -> None:
        times = self.timer.saved()
        if times is not None and self.auto is not None:
            self.auto.saved(*times)

    def due(self, trainer: pl.Trainer, last_save_step: int) -> bool:
        """After a training batch with a new optimizer step (every rank): whether a save is due now."""
        if self.timer.writing is not None:
            to_durable = self.timer.written()
            if to_durable is not None and self.auto is not None:
                self.auto.durable(to_durable)
        if self.fixed is not None:
            due = trainer.global_step % self.fixed == 0
        else:
            due = self.auto is not None and self.auto.due(trainer, last_save_step)
        if self.minutes is None or due:
            return due
        elapsed = time.monotonic() - self.timer.last_saved >= self.minutes * 60
        return bool(broadcast(trainer.strategy, elapsed))  # clocks differ between ranks: rank 0 decides
