"""``RequeueCheckpoint``'s cadence: it times every save of ``last.ckpt`` and, for
``every_n_train_steps="auto"``, chooses the interval (the logic is ``lightning_resume.last_ckpt.interval``).

Every rank times its own saves and steps; rank 0 records them in the attempt history and decides the
interval from the slowest rank's stalls (one small all-reduce) and broadcasts it, after each save, so that
every rank saves at the same steps. A restart starts from the figures its history recorded.
"""

from __future__ import annotations

import collections
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl

from lightning_resume._checks import is_number, positive_number, whole_number
from lightning_resume._collectives import broadcast, max_over_ranks
from lightning_resume._scheduler.environment import ENV, on_slurm
from lightning_resume._scheduler.machine import on_aws, on_azure, on_gce, read_machine
from lightning_resume._scheduler.slurm import slurm_output
from lightning_resume.io._protocol import ReportsWrites
from lightning_resume.last_ckpt import interval as cadence
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import History
from lightning_resume.run_dir.run_dir import RunDir

log = logging.getLogger(__name__)

AUTO = "auto"
#: Batches timed before the first decision (a restart decides from its recorded save times then).
FIRST_DECISION_BATCHES = 5
#: Recent saves (times to durable) and steps whose median is used (a validation does not move it).
WINDOW = 5
STEP_WINDOW = 32


def checked_interval(value: Any) -> int | str | None:
    """``every_n_train_steps``: a whole number >= 1, ``"auto"`` or ``None``.

    Raises:
        TypeError: a string other than ``"auto"``, or not a whole number.
        ValueError: a number below 1.
    """
    if value is None or value == AUTO:
        return value
    if isinstance(value, str):  # "5" stays a wrong type, as before "auto" existed
        raise TypeError(
            f"every_n_train_steps must be a whole number of steps, 'auto' or None, got {value!r}."
        )
    return whole_number("every_n_train_steps", value, 1, "whole number of steps, 'auto' or None")


def checked_seconds(value: Any) -> float | None:
    """``expected_interruption_every`` in seconds: a ``timedelta``, a number of seconds or ``None``.

    Raises:
        TypeError: neither.
        ValueError: not positive.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif not is_number(value):
        raise TypeError(
            f"expected_interruption_every must be a timedelta, a number of seconds or None, got {value!r}."
        )
    return positive_number("expected_interruption_every", value, "timedelta or number of seconds")


def _micro(seconds: float | None) -> int:
    """Seconds as whole microseconds for an all-reduce (-1: none measured)."""
    return round(seconds * 1e6) if seconds is not None else -1


def _seconds(micro: int) -> float | None:
    return micro / 1e6 if micro >= 0 else None


def _cloud() -> str | None:
    machine = read_machine()
    for name, test in (("aws", on_aws), ("gce", on_gce), ("azure", on_azure)):
        if test(machine):
            return name
    return None


def _time_limit() -> float | None:
    if not on_slurm(os.environ):
        return None
    found = cadence.slurm_time_limit(os.environ)
    if found is not None:
        return found
    text = slurm_output(["scontrol", "-o", "show", "job", os.environ[ENV["slurm_job"]]])
    return cadence.slurm_time_limit(os.environ, text)


@dataclass(frozen=True)
class _Recorded:
    """What a restart starts from: the history's figures (rank 0).

    Attributes:
        stalls: The stalls after each attempt's first save, of the newest attempts.
        to_durable: The newest time to durable of the newest attempt that saved.
        step: The step time the interval was last chosen with.
    """

    stalls: attempts.Stalls = field(default_factory=attempts.Stalls)
    to_durable: float | None = None
    step: float | None = None


class Cadence:
    """Times ``RequeueCheckpoint``'s saves (every rank) and chooses the ``"auto"`` interval (rank 0).

    Args:
        every_n_train_steps: The callback's argument (checked): a number, ``"auto"`` or ``None``.
        expected_interruption_every: The user's prior, in seconds (checked), or ``None``.
    """

    def __init__(
        self, every_n_train_steps: int | str | None, expected_interruption_every: float | None
    ) -> None:
        self.fixed = every_n_train_steps if isinstance(every_n_train_steps, int) else None
        self.auto = every_n_train_steps == AUTO
        self.expected_seconds = expected_interruption_every
        self.steps: int | None = None  # the interval every rank uses ("auto")
        self.choice: cadence.Choice | None = None
        self._run_dir: RunDir | None = None
        self._prior: cadence.Prior | None = None
        self._recorded = _Recorded()
        self._reset()

    def _reset(self) -> None:
        self._start_step = 0
        self._batches = 0  # counted alike on every rank: decisions (collectives) are taken at the same one
        self._pending = True  # a decision is due: at the start, and after each save
        self._saved = False  # this attempt's first save is done (it pays one-time costs: left out)
        # the saves after the first
        self._stalls: collections.deque[float] = collections.deque(maxlen=cadence.SAVE_WINDOW)
        self._durables: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self._step_times: collections.deque[float] = collections.deque(maxlen=STEP_WINDOW)
        self._last: tuple[int, float] | None = None  # the last optimizer step seen and when
        self._stalled = 0.0  # save stall since then (left out of the step time)
        self._save: tuple[float, object] | None = None  # the save in progress: start, the last write
        self._source: ReportsWrites | None = None  # what says when the newest save is durable
        self._writing: tuple[float, object] | None = None  # a background write: its save's stall, last write

    # -- every rank ------------------------------------------------------------------------------

    def start(self, trainer: pl.Trainer, run_dir: RunDir) -> None:
        """At the start of training: the run's recorded figures and the prior (rank 0)."""
        self._reset()
        self._run_dir, self._start_step = run_dir, trainer.global_step
        if self.auto and self.steps is None:
            self.steps = cadence.FIRST_SAVE_STEPS
        if not trainer.is_global_zero:
            return
        history = run_dir.attempts.history
        measured, chosen = attempts.last_measured(history), attempts.last_cadence(history)
        self._recorded = _Recorded(
            attempts.recorded_stalls(history, cadence.SAVE_WINDOW),
            measured.last_to_durable if measured is not None else None,
            float(chosen["step_seconds"]) if chosen and chosen.get("step_seconds") else None,
        )
        if self.auto and self._prior is None:
            self._prior = cadence.prior(self.expected_seconds, _time_limit(), _cloud())

    def saving(self, trainer: pl.Trainer, writer: object = None) -> None:
        """A save of ``last.ckpt`` begins; ``writer`` writes it where the checkpoint plugin does not
        (the sharded saver). The plugin or the writer, when it says when a save is durable
        (:class:`ReportsWrites`), times a write that goes on in the background."""
        source = writer if writer is not None else trainer.strategy.checkpoint_io
        self._source = source if isinstance(source, ReportsWrites) else None
        self._save = (time.monotonic(), self._source.last_write if self._source is not None else None)

    def saved(self, trainer: pl.Trainer) -> None:
        """The save returned: its stall is timed; its time to durable now, or when its write is done."""
        if self._save is None:
            return
        started, write_before = self._save
        self._save = None
        stall = time.monotonic() - started
        if not self._saved:
            self._saved = True
        else:
            self._stalls.append(stall)
        self._stalled += stall
        self._pending = True
        background = self._source is not None and self._source.last_write is write_before
        if background:
            self._writing = (stall, write_before)  # committed later, by the plugin's writer
        else:
            self._durables.append(stall)  # written (and fsynced) before save returned
        self._record(trainer, stall=stall, to_durable=None if background else stall)

    def due(self, trainer: pl.Trainer, last_save_step: int) -> bool:
        """After a training batch with a new optimizer step (every rank): whether a save is due now."""
        self._time_step(trainer)
        self._check_write(trainer)
        if self.fixed is not None:
            return trainer.global_step % self.fixed == 0
        if not self.auto:
            return False
        self._batches += 1
        if self._pending and self._batches >= FIRST_DECISION_BATCHES:
            self._pending = False
            self._decide(trainer)
        base = max(last_save_step, self._start_step)
        return self.steps is not None and trainer.global_step - base >= self.steps

    def _time_step(self, trainer: pl.Trainer) -> None:
        now, step = time.monotonic(), trainer.global_step
        if self._last is not None and step > self._last[0]:
            seconds = max(now - self._last[1] - self._stalled, 0.0)
            self._step_times.append(seconds / (step - self._last[0]))
        self._last, self._stalled = (step, now), 0.0

    def _check_write(self, trainer: pl.Trainer) -> None:
        """A background write of the newest save is done: its time to durable is the stall plus the write."""
        if self._writing is None:
            return
        write = self._source.last_write if self._source is not None else None
        stall, before = self._writing
        if write is None or write is before:
            return
        self._writing = None
        to_durable = stall + write.seconds
        self._durables.append(to_durable)
        self._record(trainer, to_durable=to_durable)

    def _record(self, trainer: pl.Trainer, **times: float | None) -> None:
        if trainer.is_global_zero and self._run_dir is not None:
            self._run_dir.attempts.saved_last_ckpt(**times)

    # -- the decision: every rank calls, rank 0 decides ------------------------------------------------

    def _decide(self, trainer: pl.Trainer) -> None:
        strategy = trainer.strategy
        # The slowest rank's stall holds every rank: the mean of its saves after its first.
        later = max_over_ranks(strategy, _micro(cadence.mean_stall(self._stalls)))
        steps = self._choose(_seconds(later)) if trainer.is_global_zero else None
        self.steps = broadcast(strategy, steps)

    def _choose(self, later: float | None) -> int | None:
        """Rank 0: the interval from the measurements (or the recorded ones); the current one until known."""
        recorded = self._recorded
        count = len(self._stalls)
        mine = attempts.Stalls(later * count, count) if later is not None else attempts.Stalls()
        stall = cadence.save_cost(mine, recorded.stalls)
        durable = statistics.median(self._durables) if self._durables else recorded.to_durable
        if durable is None and self._writing is None and stall is not None:
            durable = stall
        step = statistics.median(self._step_times) if len(self._step_times) >= WINDOW else recorded.step
        step = (
            step if step is not None else (statistics.median(self._step_times) if self._step_times else None)
        )
        if stall is None or durable is None or step is None or self._run_dir is None:
            return self.steps  # measuring: FIRST_SAVE_STEPS until a save after a first one is timed
        assert self._prior is not None
        history: History = self._run_dir.attempts.history
        seen = cadence.interruptions(history, time.time())
        between = cadence.time_between_interruptions(seen, self._prior)
        choice = cadence.choose(cadence.Measurements(stall, max(durable, stall), step), between)
        if self.choice is None or cadence.material(self.steps, choice.steps):
            initial = self.choice is None
            self.choice = choice
            log.info(
                "RequeueCheckpoint(every_n_train_steps='auto') %s %s",
                "saves" if initial else "now saves",
                choice.describe(),
            )
            self._run_dir.attempts.chose_cadence(choice.to_dict())
            return choice.steps
        return self.steps
