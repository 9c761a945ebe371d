"""``ProgressWatchdog``: a stuck rank becomes a clean restart, and a run that keeps failing a clear stop."""

from __future__ import annotations

import functools
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._checks import find_one, flag, whole_number
from lightning_resume._collectives import broadcast
from lightning_resume._scheduler.environment import ENV, expects_peers
from lightning_resume.exceptions import CrashLoopStopped
from lightning_resume.exit_status.exit_status import attach as attach_exit_status
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.resolve import Resolution
from lightning_resume.run_dir.run_dir import RunDir, attempts_of
from lightning_resume.watchdog import crash_loop
from lightning_resume.watchdog import timeouts as learned
from lightning_resume.watchdog.action import CRASH_LOOP_EXIT_CODE, HANG_EXIT_CODE, Who, act_on_hang
from lightning_resume.watchdog.monitor import Progress, Watchdog
from lightning_resume.watchdog.timeouts import Section, Timeouts, WatchdogTimeouts

log = logging.getLogger(__name__)

#: Sections entered inside another one; the outer one goes on (its time so far kept) when they end.
_NESTED = frozenset({Section.VALIDATION, Section.SAVE, Section.LOAD})
#: Seconds between two writes of the learned times (a section seen for the first time is written at once).
_PERSIST_SECONDS = 60.0


def _rank_from_env() -> int:
    """The global rank launchers report before any process group exists (0 when none does)."""
    for var in (ENV["rank"], ENV["slurm_procid"], ENV["local_rank"]):
        value = os.environ.get(var, "")
        if value.strip().isdigit():
            return int(value)
    return 0


def _world_size_from_env() -> int:
    value = os.environ.get(ENV["world_size"], "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else 1


def _on_hang(ref: weakref.ReferenceType[ProgressWatchdog], progress: Progress, seconds: float) -> None:
    """The watchdog thread's action (held through a weak reference: the thread keeps no callback alive)."""
    watchdog = ref()
    if watchdog is not None:
        act_on_hang(watchdog._who, progress, seconds, os.environ, requeue=watchdog.requeue)


class ProgressWatchdog(Callback):
    """Turn a hung rank into a clean restart, and a run that keeps failing into a clear stop.

    **Hangs.** Each rank runs a watchdog thread that knows which section the rank is in (start-up
    until the first step has ended, a training step, validation, an epoch end, a save, the load,
    teardown) and how long it may take (:class:`~lightning_resume.WatchdogTimeouts`; learned times
    are kept in the run dir's ``watchdog.json`` for the next attempt). The thread works while the
    main thread is blocked in C (a collective waiting for a dead peer, a stuck filesystem). Past its
    timeout, a rank writes every thread's stack to ``<run dir>/hangs/attempt-<N>-rank-<R>.txt``, logs
    one line, records the hang in ``status.json`` (rank 0) and exits with :attr:`HANG_EXIT_CODE`:
    torchrun's ``--max-restarts`` restarts the group, and under SLURM rank 0 requeues the job once.
    The restart resumes from the last durable ``last.ckpt``.

    **Crash loops.** When the last ``max_attempts_without_progress`` attempts (``attempts.json``) all
    ended failed, hung or killed without a new durable checkpoint, the next attempt stops at
    ``setup``: it logs one line, does not requeue, and raises
    :class:`~lightning_resume.CrashLoopStopped` (exit status :attr:`CRASH_LOOP_EXIT_CODE`). Once the
    cause is fixed, ``lightning-resume reset-crash-loop RUN_DIR`` lets the next attempt train.

    Needs a :class:`~lightning_resume.RunDir` in the same Trainer. In one rank of several (torchrun,
    ``srun``, Lightning's launcher) the start-up clock starts at construction, to cover the
    process-group set-up: construct it just before the Trainer. A lone process is watched from
    ``setup`` on.

    Args:
        timeouts: How long each section may take (:class:`~lightning_resume.WatchdogTimeouts`; default:
            every one learned, 5 times the slowest time seen, at least 300 s, 1800 s until seen).
        max_attempts_without_progress: Stop before training after this many attempts in a row
            ended without a new durable checkpoint; ``0`` never stops.
        requeue: Let rank 0 requeue a hung SLURM job. ``False``: exit only.
        failure_classes: End any failed ``fit`` with its failure class's exit status, the same on every
            rank, and record the class in ``attempts.json`` (see the failure classes page). ``False``
            here or on ``PreemptionHandler`` turns it off.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for a negative ``max_attempts_without_progress``.
        MissingCallbackError: at ``setup`` without a ``RunDir``.
        CrashLoopStopped: at ``setup``, when the run is in a crash loop.

    Example::

        callbacks = [RunDir(), RequeueCheckpoint(every_n_train_steps=500), ProgressWatchdog()]
        trainer = Trainer(callbacks=callbacks)
    """

    #: Exit status of a rank that hung (sysexits' EX_TEMPFAIL: restart).
    HANG_EXIT_CODE = HANG_EXIT_CODE
    #: Exit status of an attempt stopped by the crash-loop rule: do not requeue (as nvidia-resiliency-ext).
    CRASH_LOOP_EXIT_CODE = CRASH_LOOP_EXIT_CODE

    def __init__(
        self,
        timeouts: WatchdogTimeouts | None = None,
        max_attempts_without_progress: int = 3,
        requeue: bool = True,
        failure_classes: bool = True,
    ) -> None:
        if timeouts is not None and not isinstance(timeouts, WatchdogTimeouts):
            raise TypeError(f"timeouts must be WatchdogTimeouts(...) or None, got {timeouts!r}.")
        self.timeouts = timeouts if timeouts is not None else WatchdogTimeouts()
        self.max_attempts_without_progress = whole_number(
            "max_attempts_without_progress", max_attempts_without_progress, minimum=0
        )
        self.requeue = flag("requeue", requeue)
        self.failure_classes = flag("failure_classes", failure_classes)
        self._timeouts = Timeouts(self.timeouts)
        self._who = Who(rank=_rank_from_env(), world_size=_world_size_from_env(), run_dir=None, attempt=None)
        self._run_dir: RunDir | None = None
        self._step: int | None = None
        self._section = Section.STARTUP
        self._since = time.monotonic()
        self._outer: tuple[Section, float] | None = None  # the section a nested one interrupted, its time
        self._first_batch: float | None = None  # when the first step's batch arrived
        self._dirty = False
        self._persisted = time.monotonic()
        self._persist_failed = False
        self._dog = self._new_watchdog()
        self._report()
        if expects_peers(os.environ) or os.environ.get(ENV["elastic_run"]):
            # One rank of several: cover the process-group set-up. A lone process is watched from setup.
            self._dog.start()
        PROCESS.when_ready(self._bind)

    def _new_watchdog(self) -> Watchdog:
        dog = Watchdog(functools.partial(_on_hang, weakref.ref(self)))
        weakref.finalize(self, dog.stop)
        return dog

    def _report(self, until: Callable[[], bool] | None = None) -> None:
        section = self._section
        self._dog.report(Progress(section, self._step, self._since, self._timeouts.timeout(section), until))

    def _enter(self, section: Section, trainer: pl.Trainer | None = None) -> None:
        """Start ``section`` now (a nested one remembers the section it interrupts)."""
        now = time.monotonic()
        if section in _NESTED and self._section not in _NESTED:
            self._outer = (self._section, now - self._since)
        elif section not in _NESTED:
            self._outer = None
        self._section, self._since = section, now
        if trainer is not None:
            self._step = trainer.global_step
        self._report()

    def _leave_nested(self, trainer: pl.Trainer) -> None:
        """End a nested section, going on with the one it interrupted (a save is observed here)."""
        if self._section not in _NESTED or self._outer is None:
            return
        now = time.monotonic()
        if self._section is Section.SAVE:
            spent = now - self._since
            self._observe(Section.SAVE, spent, trainer)
            if self._run_dir is not None and trainer.is_global_zero:
                attempts_of(self._run_dir).saved(spent)
        outer, before = self._outer
        self._outer = None
        self._section, self._since = outer, now - before
        self._report()

    def _observe(self, section: Section, seconds: float, trainer: pl.Trainer) -> None:
        first = section not in self._timeouts.slowest
        if self._timeouts.observe(section, seconds):
            self._dirty = True
        if self._dirty and (first or time.monotonic() - self._persisted >= _PERSIST_SECONDS):
            self._persist(trainer)

    def _persist(self, trainer: pl.Trainer) -> None:
        """Write the learned times to ``watchdog.json`` (rank 0); a failure is reported, never raised."""
        self._persisted = time.monotonic()
        self._dirty = False
        path = self._who.run_dir
        if path is None or not trainer.is_global_zero:
            return
        try:
            learned.write(path, self._timeouts, self.max_attempts_without_progress)
        except OSError as e:
            if not self._persist_failed:  # once: it is retried every minute
                self._persist_failed = True
                log.warning("could not record the watchdog's timeouts in %s: %s", path, e)

    def _bind(self, resolution: Resolution) -> None:
        """The run dir is known: start from the section times earlier attempts saw."""
        self._who = Who(self._who.rank, self._who.world_size, resolution.path, self._who.attempt)
        self._timeouts.merge(learned.read_slowest(resolution.path))
        self._report()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            self._dog.report(None)  # only fit is watched
            return
        why = "it records hangs and attempts in the run dir"
        self._run_dir = run_dir = find_one(trainer, RunDir, "ProgressWatchdog", why)
        attach_exit_status(trainer)
        if self._dog.fired is None and not self._dog.alive:
            if self._dog.started:  # a second fit with this callback
                self._dog = self._new_watchdog()
            # A lone process is watched from here (and a second fit from its own start).
            self._section, self._since, self._outer = Section.STARTUP, time.monotonic(), None
            self._first_batch = None
            self._report()
            self._dog.start()
        number = attempts_of(run_dir).begin(trainer, stage)
        stop = self._crash_loop(run_dir) if trainer.is_global_zero else None
        number, stop = broadcast(trainer.strategy, (number, stop))
        self._who = Who(trainer.global_rank, trainer.world_size, run_dir.path, number)
        self._timeouts.merge(learned.read_slowest(run_dir.path))
        if trainer.is_global_zero:
            self._persist(trainer)
        if stop is not None:
            self._dog.report(None)
            if trainer.is_global_zero:
                log.error("%s", stop)
            raise CrashLoopStopped(stop, self.CRASH_LOOP_EXIT_CODE, self.max_attempts_without_progress)
        if run_dir.is_resumed:
            self._enter(Section.LOAD)
        else:
            self._report()

    def _crash_loop(self, run_dir: RunDir) -> str | None:
        """The line to stop with, when the last attempts ended without progress (rank 0)."""
        if self.max_attempts_without_progress == 0:
            return None
        record = attempts_of(run_dir)
        streak = crash_loop.without_progress(record.history, before=record.number)
        if len(streak) < self.max_attempts_without_progress:
            return None
        return (
            f"ProgressWatchdog: not training: the last {len(streak)} attempts of run {run_dir.run_id} ended "
            f"without a new durable checkpoint ({crash_loop.describe_streak(streak)}). Exiting with status "
            f"{self.CRASH_LOOP_EXIT_CODE}, without a requeue. Fix the cause, then run "
            f"`lightning-resume reset-crash-loop {run_dir.path}` and submit again."
        )

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._section is Section.LOAD:
            self._observe(Section.LOAD, time.monotonic() - self._since, trainer)
            self._leave_nested(trainer)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Sharded strategies load after this hook; the others have loaded by now (or had nothing to load).
        if self._section is Section.LOAD and not trainer.strategy.restore_checkpoint_after_setup:
            self._leave_nested(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step = trainer.global_step  # restored by now
        self._report()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave_nested(trainer)  # a save that ended before this validation
        self._enter(Section.VALIDATION, trainer)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._section is Section.VALIDATION:
            now = time.monotonic()
            self._observe(Section.VALIDATION, now - self._since, trainer)
            self._since = now
            self._report()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._section is Section.VALIDATION:
            self._leave_nested(trainer)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave_nested(trainer)
        self._end_epoch_end(trainer)

    def _end_epoch_end(self, trainer: pl.Trainer) -> None:
        if self._section is Section.EPOCH_END:
            self._observe(Section.EPOCH_END, time.monotonic() - self._since, trainer)
            self._enter(Section.STEP, trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._leave_nested(trainer)
        if self._section is Section.STARTUP and self._first_batch is None:
            self._first_batch = time.monotonic()
        self._end_epoch_end(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._leave_nested(trainer)
        now = time.monotonic()
        if self._section is Section.STARTUP:
            self._observe(Section.STARTUP, now - self._since, trainer)
            self._observe(Section.STEP, now - (self._first_batch or self._since), trainer)
        elif self._section is Section.STEP:
            self._observe(Section.STEP, now - self._since, trainer)
        self._enter(Section.EPOCH_END if trainer.is_last_batch else Section.STEP, trainer)

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Called as the checkpoint is assembled; the write and any wait follow, until the next hook.
        if self._section is not Section.SAVE:
            self._enter(Section.SAVE, trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave_nested(trainer)
        self._enter(Section.TEARDOWN, trainer)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave_nested(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self._section is Section.TEARDOWN:
            self._observe(Section.TEARDOWN, time.monotonic() - self._since, trainer)
        self._persist(trainer)
        self._dog.stop()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self._dog.fired is not None:
            # Acting on a hang (this is a peer's collective failing): the watchdog's report and exit tell.
            time.sleep(60)
        if trainer.state.fn != "fit":
            return
        if isinstance(exception, CrashLoopStopped):
            self._dog.stop()
            return
        self._persist(trainer)
        # Lightning's clean-up after the error is still watched; it is over once the stage is reset.
        ref = weakref.ref(trainer)
        self._section, self._since, self._outer = Section.TEARDOWN, time.monotonic(), None
        self._report(until=lambda: (t := ref()) is None or t.state.stage is None)
