"""``SignalDiagnostics``: log who handles each signal, warn about set-ups that lose requeues."""

from __future__ import annotations

import logging
import os

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._warnings import warn
from lightning_resume.exceptions import Preempted
from lightning_resume.preemption import signals
from lightning_resume.preemption.preemption_handler import PreemptionHandler
from lightning_resume.preemption.stop_state import StopReport

log = logging.getLogger(__name__)


class SignalDiagnostics(Callback):
    """Log the handler of SIGTERM, SIGINT, SIGUSR1, SIGUSR2 and SIGCONT, with who installed it.

    Logged at construction, at train start (after Lightning's handlers) and when ``fit`` ends, with
    warnings and what to do about known bad set-ups: a SIGUSR1 handler that silently turns Lightning's
    SLURM requeue off, SIGTERM at its default under SLURM, no ``scontrol`` on PATH, submitit bypassing
    SIGTERM. When a preemption ended ``fit``: which signal, at which step, and whether it requeued.

    Example::

        diagnostics = SignalDiagnostics()
        trainer = Trainer(callbacks=[diagnostics, RunDir(), RequeueCheckpoint(), PreemptionHandler()])
    """

    def __init__(self) -> None:
        self._exception: BaseException | None = None
        self.report("construction")

    def report(self, moment: str, trainer: pl.Trainer | None = None) -> list[str]:
        """Log the handler table and warnings now; return the warnings."""
        table = signals.handler_table()
        log.info("signal handlers at %s: %s", moment, "; ".join(f"{n} {info}" for n, info in table.items()))
        handled = trainer is not None and any(isinstance(cb, PreemptionHandler) for cb in trainer.callbacks)  # type: ignore[attr-defined]
        problems = signals.known_problems(table, os.environ, preemption_handler=handled)
        for problem in problems:
            warn(problem, all_ranks=True)
        return problems

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.report("train start", trainer)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # Lightning runs no teardown hook after an exception: this is the end of fit.
        self._exception = exception
        self._end_of_fit(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._end_of_fit(trainer)

    def _end_of_fit(self, trainer: pl.Trainer) -> None:
        if not trainer.is_global_zero:
            return
        self.report("end of fit", trainer)
        handlers = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionHandler)]  # type: ignore[attr-defined]
        stopped: StopReport | None = handlers[0].stop_report if handlers else None
        if stopped is not None:
            log.warning(
                "fit ended by %s at step %s; requeue: %s", stopped.signal, stopped.step, stopped.requeue
            )
        elif self._exception is not None and not isinstance(self._exception, Preempted):
            received = handlers[0].received if handlers else None
            suffix = f" (after {received})" if received else ""
            log.warning("fit ended by %s%s; no requeue was issued", type(self._exception).__name__, suffix)
