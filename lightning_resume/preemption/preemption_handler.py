"""``PreemptionHandler``: a preemption signal becomes a durable ``last.ckpt``, a requeue, a non-zero exit."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from dataclasses import replace
from types import FrameType
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._checks import flag, whole_number
from lightning_resume._collectives import gather_objects, max_over_ranks
from lightning_resume._scheduler.environment import is_global_zero, under_submitit
from lightning_resume.exceptions import Preempted
from lightning_resume.exit_status.exit_status import attach as attach_exit_status
from lightning_resume.failure_classes import FailureClass
from lightning_resume.io._protocol import ReportsWrites
from lightning_resume.last_ckpt.stop_saves import StopSaves
from lightning_resume.preemption.notices._notice import Notice
from lightning_resume.preemption.notices._notice_source import NoticeSource
from lightning_resume.preemption.notices._notices import Notices, as_notices
from lightning_resume.preemption.notices._policy import Act
from lightning_resume.preemption.notices._watch import NoticeWatch
from lightning_resume.preemption.requeue import requeue_job
from lightning_resume.preemption.signals import (
    PREEMPT_SIGNALS,
    catchable_signal,
    describe,
    signal_number,
    submitit_signal,
)
from lightning_resume.preemption.stop_state import Event, Stage, StopReport, StopState
from lightning_resume.preemption.worker_signals import block_in_workers, unblock_in_workers

log = logging.getLogger(__name__)

_Handler = Any  # what signal.getsignal returns: a callable, SIG_DFL, SIG_IGN or None
_Wanted = tuple[Act, "Notice | None"]  # what a rank wants at a check, and the notice that asks for it


class PreemptionHandler(Callback):
    """Stop on a preemption signal without losing work, without hangs, and get the job requeued.

    Handlers are installed at construction, so the setup window before ``fit`` (data, DDP init) is
    covered; a signal there, before the sanity check, requeues and exits at once (nothing new to save).
    A handler only records the signal and logs one line; handlers installed before (the user's) are
    still called, and all are restored at the end of ``fit``. At the next step boundary all ranks agree
    on the flag (one small all-reduce: a signal to one rank stops every rank), ``last.ckpt`` is written
    through :class:`~lightning_resume.RequeueCheckpoint` and waited on until durable, the job is
    requeued once (``scontrol requeue`` on rank 0 under SLURM, submitit's own path under submitit,
    nothing elsewhere) and ``fit`` ends with :class:`~lightning_resume.Preempted`, a ``SystemExit`` with
    a non-zero status.

    A signal during fit's validation or the sanity check stops within one validation batch, with
    ``last.ckpt`` holding the last training step; the restart runs that validation again. Work in
    another callback's ``on_train_epoch_end`` cannot be interrupted: put ``PreemptionHandler`` after
    callbacks with long epoch-end work. DataLoader workers ignore a signal sent to the whole process
    group (as SLURM does). Lightning's own SIGTERM handling (exit status 0, can hang DDP) is replaced,
    and with a SIGUSR1 handler present ``SLURMEnvironment(auto_requeue=True)`` installs none: no second
    requeue, no ``hpc_ckpt_N.ckpt``.

    Args:
        signals: Signal names that mean "preempted" (a list, or one name). Default: SIGTERM, SIGUSR1,
            SIGUSR2 (and submitit's ``$SUBMITIT_PREEMPT_SIGNAL`` under submitit).
        requeue: Requeue the job (SLURM / submitit). ``False``: save and exit only.
        exit_code: Exit status after a preemption, 1..255 (default 143, "terminated": the ``preempted``
            class of ``lightning_resume.failure_classes``).
        check_every_n_steps: Agree on the flag every this many training (and validation) batches: one
            small all-reduce per check under DDP (about 2 ms on 2 CPU ranks); the stop comes up to this
            many batches later.
        notices: Preemption notices polled off the training thread and acted on through the same
            agreement: a :class:`~lightning_resume.notices.Notices` (its sources, what a notice does,
            the margin kept before its deadline); default ``Notices()``, every source that applies on
            the machine; ``None``: none.
        on_notice: Deprecated (0.x): folded into ``notices`` with a ``FutureWarning``, as are
            ``notices="auto"`` and a list of sources; use ``Notices(on_notice=...)``.
        notice_margin: Deprecated (0.x): use ``Notices(margin=...)``.
        failure_classes: End any failed ``fit`` with its failure class's exit status, the same on every
            rank, and record the class in ``attempts.json`` (see the failure classes page). ``False``
            here or on ``ProgressWatchdog`` turns it off.

    Raises:
        ValueError: for an unknown or uncatchable signal (SIGKILL, SIGSTOP), or an exit code outside
            1..255.
        TypeError: for arguments of the wrong type (``notices`` neither ``Notices`` nor ``None``).

    Example::

        callbacks = [RunDir(), RequeueCheckpoint(every_n_train_steps=500), PreemptionHandler()]
        trainer = Trainer(callbacks=callbacks)
    """

    def __init__(
        self,
        signals: list[str] | None = None,
        requeue: bool = True,
        exit_code: int = FailureClass.PREEMPTED.exit_code,
        check_every_n_steps: int = 1,
        notices: Notices | Literal["auto"] | list[NoticeSource] | None = Notices(),  # noqa: B008  (frozen: a shared default is safe)
        failure_classes: bool = True,
        *,
        on_notice: str | None = None,
        notice_margin: float | None = None,
    ) -> None:
        whole_number("exit_code", exit_code, what="whole number from 1 to 255")
        if not 1 <= exit_code <= 255:
            raise ValueError(
                f"exit_code must be within 1..255, got {exit_code!r}: 0 tells the scheduler the job "
                "finished, and a process exit status keeps only its low 8 bits (256 would become 0)."
            )
        flag("requeue", requeue)
        whole_number("check_every_n_steps", check_every_n_steps, 1)
        notices = as_notices(notices, on_notice, notice_margin)
        if isinstance(signals, str):
            signals = [signals]  # one name, not a list of characters
        names = list(signals) if signals is not None else list(PREEMPT_SIGNALS)
        if signals is None and under_submitit(os.environ):
            names.append(submitit_signal(os.environ))
        self.signals = sorted({catchable_signal(name) for name in names})
        self.requeue = requeue
        self.exit_code = exit_code
        self.failure_classes = flag("failure_classes", failure_classes)
        self.check_every_n_steps = check_every_n_steps
        self.notices = notices
        self._notices = NoticeWatch(notices)
        self._state = StopState()
        self._batches_seen = 0
        self._pid = os.getpid()
        self._previous: dict[signal.Signals, _Handler] = {}
        self._saves: StopSaves | None = None
        atexit.register(self._state.move, Event.EXIT)  # after torch's finalizers: runs before them
        self.install()

    @property
    def received(self) -> str | None:
        """Name of the first preemption signal received, if any."""
        return self._state.signal[0].name if self._state.signal else None

    @property
    def stop_report(self) -> StopReport | None:
        """How ``fit`` was stopped (signal, step, requeue, latencies), or ``None`` if it was not."""
        report = self._state.report
        return report if report is not None and report.requeue is not None else None

    def install(self) -> None:
        """Install the handlers (main thread only), keeping the ones they replace for chaining."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("PreemptionHandler constructed outside the main thread: no signal handlers installed")
            return
        for sig in self.signals:
            current = signal.getsignal(sig)
            if current != self._handle:
                self._previous[sig] = current
                signal.signal(sig, self._handle)
        block_in_workers(self.signals)

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        unblock_in_workers()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if os.getpid() != self._pid and self._state.stage is not Stage.EXITING:
            # A forked child inherited this handler: the training process decides. The child gets what
            # it would have got without us (a pool's terminate() must still end it).
            self._as_before_in_child(signum, frame)
            return
        ignored = self._state.signalled(sig, time.monotonic())
        if ignored is not None:  # (while exiting: a raise in an exit handler prints a traceback)
            log.warning("%s received %s: ignored", sig.name, ignored)
            return
        idle = self._state.stage is Stage.IDLE
        when = "not training yet: exiting now" if idle else "training stops at the next step boundary"
        log.warning("%s received (pid %s): %s", sig.name, os.getpid(), when)
        previous = self._previous.get(sig)
        if callable(previous) and describe(previous).origin == "user":
            previous(signum, frame)
        if idle:
            self._stop_before_training(sig)

    def _as_before_in_child(self, signum: int, frame: FrameType | None) -> None:
        """In a forked child: the handler installed before ours, or the default action."""
        previous = self._previous.get(signal.Signals(signum))
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _stop_before_training(self, sig: signal.Signals) -> None:
        requeued = self._issue_requeue(sig) if is_global_zero(os.environ) else "left to rank 0"
        self._state.stop(StopReport(sig.name, None, requeue=requeued))
        self._state.move(Event.END)
        raise Preempted(self.exit_code)

    def _issue_requeue(self, sig: signal.Signals) -> str:
        if not self.requeue:
            return "disabled"
        submitit = self._submitit_requeue()
        via_submitit = (lambda: submitit(int(sig), None)) if submitit is not None else None
        return requeue_job(os.environ, via_submitit, warn=log.warning)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._saves = StopSaves(trainer, "PreemptionHandler")
        self._saves.at_each_epoch_boundary(self._at_epoch_boundary)
        self.install()
        if stage == "fit":
            attach_exit_status(trainer)
            self._notices.start(trainer.local_rank, trainer.global_rank, self._saves.recorded_to_durable())

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # From here on a signal is acted on at the next batch boundary, on every rank at once. Lightning
        # has just put its SIGTERM handler (which broadcasts under DDP) in front of ours; ours must decide
        # alone (Lightning restores its pre-fit handlers, ours, after fit).
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                if signal.getsignal(sig) != self._handle:
                    signal.signal(sig, self._handle)
        self._state.move(Event.TRAIN)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_sanity_check_start(trainer, pl_module)

    def _check_due(self) -> bool:
        # Counted here: global_step repeats under gradient accumulation, and all ranks run the same batches.
        self._batches_seen += 1
        return self._batches_seen % self.check_every_n_steps == 0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # An epoch's last batch is not a resume point: its end (with a stateful loader: the next epoch's
        # first batch) is, so the check waits for it.
        if self._check_due() and not trainer.is_last_batch:
            self._act(trainer, *self._agree(trainer))

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
        if trainer.state.fn != "fit" or not self._state.training or not self._check_due():
            return
        # A notice's save while training goes on waits for the next training batch.
        act, wanted = self._agree(trainer)
        if act < Act.STOP:
            return
        if trainer.sanity_checking:
            # No training step has run: nothing to save; the restart runs the sanity check again.
            cause, start = self._cause(trainer, act, wanted)
            self._state.stop(StopReport(cause, trainer.global_step, started=start, seconds_to_durable=0.0))
        else:
            # Validation changes no training state: save the last step's, to redo this validation.
            self._save(trainer, act, wanted, in_validation=True)
        self._exit(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Exiting here rather than right after the save lets Lightning log the saved step's metrics.
        if self._state.stage is Stage.STOPPING:
            self._exit(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Not a resume point: the epoch's end is agreed on as the next epoch starts (_at_epoch_boundary).
        if self._state.stage is Stage.STOPPING:
            self._exit(trainer)

    def _at_epoch_boundary(self, trainer: pl.Trainer) -> None:
        """The resume point between epochs, before the next one's hooks (``RequeueCheckpoint`` calls it)."""
        assert self._saves is not None
        if self._state.training and not self._saves.boundary_saved_later:
            self._act(trainer, *self._agree(trainer))
        if self._state.stage is Stage.STOPPING:
            self._exit(trainer)

    def _agree(self, trainer: pl.Trainer) -> tuple[Act, _Wanted]:
        """The most urgent act any rank wants at this batch, and what this rank wanted (a collective)."""
        io = trainer.strategy.checkpoint_io
        wanted = (Act.SIGNAL, None) if self._state.stage is Stage.SIGNALLED else self._notices.wanted(io)
        return Act(max_over_ranks(trainer.strategy, int(wanted[0]))), wanted

    def _act(self, trainer: pl.Trainer, act: Act, wanted: _Wanted) -> None:
        if act == Act.SAVE:  # for a notice: make last.ckpt durable now, and train on
            assert self._saves is not None
            notice = _shared_notice(trainer, wanted, Act.SAVE)
            record = self._notices.saved(notice, trainer.global_step, self._saves.save_durably(trainer))
            if trainer.is_global_zero:
                log.warning("%s", self._notices.describe_save(record, trainer.strategy.checkpoint_io))
        elif act >= Act.STOP:
            self._save(trainer, act, wanted)

    def _cause(self, trainer: pl.Trainer, act: Act, wanted: _Wanted) -> tuple[str, float]:
        """What stops ``fit`` (a signal, or a notice) and its ``time.monotonic()``."""
        if act == Act.STOP:
            notice = _shared_notice(trainer, wanted, Act.STOP)
            self._notices.acting_on(notice)
            return f"the {notice.source} notice", time.monotonic()
        if self._state.signal is not None:
            return self._state.signal[0].name, self._state.signal[1]
        return "a signal on another rank", time.monotonic()

    def _save(self, trainer: pl.Trainer, act: Act, wanted: _Wanted, in_validation: bool = False) -> None:
        """Make ``last.ckpt`` durable at this resume point; the exit follows at the next hook."""
        assert self._saves is not None
        cause, start = self._cause(trainer, act, wanted)
        self._saves.save_durably(trainer, in_validation, stopping=True)
        seconds, io = time.monotonic() - start, trainer.strategy.checkpoint_io
        write = io.last_write if isinstance(io, ReportsWrites) else None
        report = StopReport(cause, trainer.global_step, start, seconds_to_durable=seconds, write=write)
        record = self._notices.record
        if record is not None:  # a notice came first: what it led to
            record.durable_after(time.time(), seconds)
            gained = record.steps_gained(trainer.global_step)
            report = replace(report, notice=record.notice, notice_to_durable=record.notice_to_durable)
            report = replace(report, steps_after_notice=gained)
        self._state.stop(report)

    def _exit(self, trainer: pl.Trainer) -> None:
        """Requeue (rank 0) and end ``fit`` with :class:`~lightning_resume.Preempted`."""
        report = self._state.report
        assert report is not None
        sig = self._state.signal[0] if self._state.signal else signal.SIGTERM
        if trainer.is_global_zero and self._submitit_requeue() is not None:
            # submitit requeues and exits from its own handler: say everything before handing over.
            self._state.report = replace(report, requeue="through submitit")
            self._log_stop(report, "through submitit, which exits", None)
        requeued = self._issue_requeue(sig) if trainer.is_global_zero else "left to rank 0"
        total = time.monotonic() - report.started
        self._state.report = replace(report, requeue=requeued, seconds_to_exit=total)
        self._state.move(Event.END)
        if trainer.is_global_zero:
            self._log_stop(report, requeued, total)
        raise Preempted(self.exit_code)

    def _log_stop(self, report: StopReport, requeued: str, total: float | None) -> None:
        since = "the stop" if report.by_notice else "the signal"
        exits = "" if total is None else f"; exiting with status {self.exit_code} {total:.3f} s after {since}"
        record = self._notices.record
        log.warning(
            "Preempted by %s at step %s: last.ckpt durable %.3f s after %s%s; requeue: %s%s%s",
            report.signal,
            report.step,
            report.seconds_to_durable,
            since,
            f" ({report.write.describe()})" if report.write is not None else "",
            requeued,
            exits,
            f"; {record.describe(report.step)}" if record is not None else "",
        )

    def _submitit_requeue(self) -> Any:
        """submitit's preempt handler (which requeues and exits) when running under submitit."""
        if not under_submitit(os.environ):
            return None
        handler = self._previous.get(signal_number(submitit_signal(os.environ)))
        return handler if callable(handler) else None

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._state.move(Event.LEAVE)
        self._notices.stop()
        self.uninstall()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning runs no teardown hook after an exception


def _shared_notice(trainer: pl.Trainer, wanted: _Wanted, agreed: Act) -> Notice:
    """The notice of the first rank that wanted ``agreed`` (a notice's save or stop), on every rank."""
    for act, notice in gather_objects(trainer.strategy, wanted):
        if act == agreed and notice is not None:
            return notice
    raise RuntimeError(f"the ranks agreed on {agreed.name} for a notice, but no rank has one")
