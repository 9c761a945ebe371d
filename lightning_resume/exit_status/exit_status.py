"""``ExitStatus``: the private callback that ends a failed ``fit`` with its class's exit status, the same on
every rank, and records the class in ``attempts.json``."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._checks import the_one
from lightning_resume._collectives import broadcast
from lightning_resume._compat.lightning import put_callback, take_callback
from lightning_resume.exit_status import records
from lightning_resume.exit_status.classify import classify
from lightning_resume.exit_status.exit_hook import EXIT_HOOK
from lightning_resume.exit_status.records import FailureRecord
from lightning_resume.failure_classes import FailureClass, ending
from lightning_resume.run_dir.run_dir import RunDir, attempts_of

log = logging.getLogger(__name__)


def _one_line(exception: BaseException) -> str:
    lines = str(exception).strip().splitlines()
    return (f"{type(exception).__name__}: {lines[0]}" if lines else type(exception).__name__)[:200]


class ExitStatus(Callback):
    """Put first among a Trainer's callbacks for one ``fit`` by :func:`attach`. When ``fit`` raises, it
    records the class (or for a communication error, a peer's root cause) in the run dir and ``attempts.json``
    and arms the exit status (a ``SystemExit`` such as ``Preempted`` keeps its own)."""

    def __init__(self, run_dir: RunDir, attempt: int, rank: int, world_size: int) -> None:
        self._run_dir, self._attempt, self._rank, self._world_size = run_dir, attempt, rank, world_size
        self._trained = False  # whether this attempt finished a training step

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._trained = True

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        take_callback(trainer, self)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        take_callback(trainer, self)
        failure = classify(exception, self._trained)
        if failure is None:
            return
        code = exception.code if isinstance(exception, SystemExit) else None
        code = code if isinstance(code, int) else failure.exit_code
        mine = (self._rank, self._rank, self._attempt, time.time(), _one_line(exception))
        decided = self._agree(FailureRecord(failure, code, *mine))
        if trainer.is_global_zero:
            attempts = attempts_of(self._run_dir)
            attempts.classified(decided.failure.value, decided.exit_code, decided.cause_rank, decided.error)
        if isinstance(exception, SystemExit):
            return  # Preempted, CrashLoopStopped: their own status, and their own log line
        EXIT_HOOK.arm(exception, decided.exit_code)
        if trainer.is_global_zero:
            words = ending(decided.failure.value, decided.cause_rank, None)
            log.warning("fit failed: %s; exiting with status %s", words, decided.exit_code)

    def _agree(self, own: FailureRecord) -> FailureRecord:
        """This rank's record, written to the run dir: its own failure, or the root cause a peer recorded."""
        decided = own
        try:
            if own.failure is FailureClass.COMMUNICATION:
                decided = records.await_root_cause(self._run_dir.path, own, self._world_size)
            records.write(self._run_dir.path, decided)
        except OSError as e:
            log.warning("could not record the failure in %s: %s", self._run_dir.path / records.DIR, e)
        return decided


def attach(trainer: pl.Trainer) -> None:
    """Put an :class:`ExitStatus` first for this ``fit`` (``setup``, every rank), unless one is there, there
    is no one ``RunDir``, or a callback says ``failure_classes=False``."""
    callbacks = trainer.callbacks  # type: ignore[attr-defined]
    if any(isinstance(c, ExitStatus) or getattr(c, "failure_classes", True) is False for c in callbacks):
        return
    run_dir = the_one(trainer, RunDir)
    if run_dir is None:
        return
    EXIT_HOOK.disarm()  # an earlier fit's exception was caught: its status is no longer wanted
    number = broadcast(trainer.strategy, attempts_of(run_dir).begin(trainer, "fit")) or 0
    if trainer.is_global_zero:
        records.prune(run_dir.path, number)
    put_callback(trainer, ExitStatus(run_dir, number, trainer.global_rank, trainer.world_size))
