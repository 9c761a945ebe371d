"""``RequeueCheckpoint``: when ``last.ckpt`` is written; its hooks drive the redirect and the exact resume."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_resume._checks import expand_dir, find_one, flag, missing, positive_number
from lightning_resume._compat.lightning import (
    OWN_STATES_NOT_LOADED,
    LastCheckpointCallback,
    QuietLightning,
    put_callback,
    rebuilds_ddp_buckets,
    restoring_tuner_checkpoint,
    seeing_checkpoints,
    skips_backward,
    take_callback,
)
from lightning_resume._compat.versions import untested
from lightning_resume._warnings import warn
from lightning_resume.exact_resume.exact_resume import ExactResume
from lightning_resume.exceptions import LightningResumeError, Preempted
from lightning_resume.last_ckpt._check_hooks import CheckHooks
from lightning_resume.last_ckpt.cadence import Cadence, checked_interval, checked_seconds
from lightning_resume.last_ckpt.epoch_boundary import EpochBoundary
from lightning_resume.last_ckpt.redirect import RestartRedirect, elsewhere
from lightning_resume.last_ckpt.restart import exists, outlook, record_saved
from lightning_resume.last_ckpt.users_checkpoints import keep_off_our_last, model_checkpoint_first
from lightning_resume.last_ckpt.writing import LastCkptWrites
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.own_hparams import SavedPickles
from lightning_resume.run_dir.run_dir import RunDir, attempts_of
from lightning_resume.trackers.local_logger_resume import LocalLoggerResume

log = logging.getLogger(__name__)

LAST = layout.LAST
_NEEDS_RUN_DIR = "it says where last.ckpt lives"
_WARNED: set[str] = set()  # the distributions warned about as untested

_DDP_BUCKETS = (
    "This restart of {world} DDP ranks will not end bitwise equal to an uninterrupted run: DDP lays its "
    "gradient buckets out again after a process's first step, and a restarted process's first step sums "
    "the ranks' gradients in the first layout, another order over three or more ranks (the last bits "
    'differ). For exact resumes use strategy="ddp_find_unused_parameters_true" (DDP then keeps one layout).'
)


def _last_step(trainer: pl.Trainer) -> bool:
    """Whether ``max_steps`` ends ``fit`` here (saved before the epoch end that only this attempt runs)."""
    return trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps


def _warn_if_untested(trainer: pl.Trainer) -> None:
    """Warn once per process on a Lightning outside the tested range (its internals may have moved)."""
    distribution = (
        "pytorch-lightning" if type(trainer).__module__.startswith("pytorch_lightning") else "lightning"
    )
    problem = untested(distribution)
    if problem is not None and distribution not in _WARNED:
        _WARNED.add(distribution)
        warn(
            f"{problem}: lightning_resume reaches into a few of its internals (lightning_resume/_compat), "
            "and a change there can make a resume fail or, rarely, differ. `lightning-resume doctor` says "
            "which versions were tested; run `pytest tests/_compat` from a checkout to check this one."
        )


class RequeueCheckpoint(LastCheckpointCallback):
    """Keep ``<run dir>/checkpoints/last.ckpt`` current and resume from it after a restart.

    ``last.ckpt`` is written every ``every_n_train_steps`` optimizer steps, every ``every_n_minutes``,
    at the end of every training epoch (once it has run in full: validation, every
    ``on_train_epoch_end``, plateau schedulers, epoch metrics) and when ``fit`` stops on a preemption
    signal. Each write is atomic (fsynced and renamed, or the own write of a ``checkpoint_io`` such as
    :class:`~lightning_resume.DurableCheckpointIO`), so a kill at any instant leaves a complete file.

    Needs a :class:`~lightning_resume.RunDir` among the trainer's callbacks. On a restart
    ``trainer.fit(model)`` resumes from ``last.ckpt`` with the full state, also when given a
    ``ckpt_path`` meant for the first attempt or when Lightning finds an ``hpc_ckpt_N.ckpt``; every
    rank's random state and data position are restored, so the final weights are bitwise equal to an
    uninterrupted run's. Without ``last.ckpt`` a restart starts over if the run never committed a
    checkpoint, and raises ``ResumeError`` if it did (starting over would silently discard the run).

    Lightning's ``TensorBoardLogger``/``CSVLogger`` (the default logger too) continue with it: unless
    the Trainer lists a :class:`~lightning_resume.LocalLoggerResume`, it puts one in, so a restart
    logs into the first attempt's version dir, cut exactly at the checkpoint it resumes from.

    ``every_n_train_steps="auto"`` chooses the interval from the measured save stall and the expected
    time between interruptions (Young/Daly, see the RequeueCheckpoint page), re-evaluated after each
    save, equal on every rank, logged and recorded in the run's ``attempts.json``.

    Args:
        every_n_train_steps: Save every this many optimizer steps (``None``: not by steps; ``"auto"``:
            chosen from measurements, see above).
        every_n_minutes: Save when this many minutes passed since the last save (``None``: not by time).
        save_on_train_epoch_end: Save at the end of every training epoch (once it has run in full).
        dirpath: Where ``last.ckpt`` lives (default: ``<run dir>/checkpoints``; environment variables
            are expanded). For a node-local directory (``"$TMPDIR/ckpt"``) give
            ``DurableCheckpointIO(mirror=..., dirpath=...)`` the same one, so that a job relaunched onto
            empty nodes gets the checkpoints back from the mirror.
        keep_global_batch: On a restart with another number of ranks, keep the samples per optimizer
            step by setting ``trainer.accumulate_grad_batches``. ``False`` (the default) keeps
            Lightning's behaviour: the per-rank batch stays and the global batch scales with the ranks.
        expected_interruption_every: With ``"auto"``: how often this job expects to be interrupted
            (a ``timedelta``, seconds, or ``"h:m:s"`` in YAML), until its own history says; default:
            the SLURM time limit, 6 hours on a cloud machine, else a day.

    Raises:
        ValueError: for a non-positive interval.
        TypeError: for arguments of the wrong type (a string other than ``"auto"`` included).
        MissingCallbackError: at ``setup`` without exactly one ``RunDir`` in the Trainer.
        ResumeError: on a restart of a run that committed a checkpoint but has no ``last.ckpt``; with
            ``keep_global_batch``, on a restart whose ranks do not divide the global batch.

    Example::

        trainer = Trainer(callbacks=[RunDir(), RequeueCheckpoint(every_n_train_steps=200)])
        trainer.fit(model, datamodule=dm)  # resumes by itself after a requeue
    """

    def __init__(
        self,
        every_n_train_steps: int | Literal["auto"] | None = None,
        every_n_minutes: float | None = None,
        save_on_train_epoch_end: bool = True,
        dirpath: str | Path | None = None,
        keep_global_batch: bool = False,
        expected_interruption_every: timedelta | float | None = None,
    ) -> None:
        every_n_train_steps = checked_interval(every_n_train_steps)  # type: ignore[assignment]
        expected = checked_seconds(expected_interruption_every)
        if every_n_minutes is not None:
            positive_number("every_n_minutes", every_n_minutes, "number of minutes or None")
        flag("save_on_train_epoch_end", save_on_train_epoch_end)
        flag("keep_global_batch", keep_global_batch)
        if dirpath is not None:
            if not isinstance(dirpath, (str, Path)) or not str(dirpath).strip():
                raise ValueError(f"dirpath must be a directory path or None, got {dirpath!r}.")
            expand_dir(dirpath, "RequeueCheckpoint(dirpath=...)")  # an unset variable: told now
        super().__init__()  # Lightning resumes fit from ``ckpt_path`` (see LastCheckpointCallback)
        self._dirpath = dirpath
        self.every_n_train_steps = every_n_train_steps
        self.expected_interruption_every = expected_interruption_every
        self._cadence = Cadence(every_n_train_steps, every_n_minutes, expected)
        self.every_n_minutes = every_n_minutes
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self._run_dir: RunDir | None = None
        self._trainer: pl.Trainer | None = None
        self._redirect = RestartRedirect()
        self.keep_global_batch = keep_global_batch
        self._exact = ExactResume(keep_global_batch, lambda: self._last_save_step)  # put in at setup
        self._boundary = EpochBoundary(self._at_epoch_boundary)  # put first: before any other hook
        self._boundary_listeners: list[Callable[[pl.Trainer], None]] = []  # (StopSaves)
        self._save_at_boundary = False  # a save is due once the epoch's end has run
        self._last_save_step = -1
        self._step_seen = 0  # the global step after the last batch: a save waits for an optimizer step
        self._marked = False  # saves.json is known to say the run committed a checkpoint
        self._quiet = QuietLightning(self)
        self._quiet_own = QuietLightning(self, OWN_STATES_NOT_LOADED)
        self._quiet_best: QuietLightning | None = None
        self._writes = LastCkptWrites(lambda: Path(self.ckpt_path), self._mark_saved)
        self._pickles = SavedPickles(self._run)  # what each save pickles, recorded before it is written
        self._check: CheckHooks | None = None  # under `lightning-resume check` only
        # Lightning's TensorBoard/CSV loggers continued (bound now: they pick their dirs before fit)
        self._logs = LocalLoggerResume()

    def _run(self) -> Path:
        """The run dir of the Trainer's ``RunDir``, or of this process's before ``setup``."""
        if self._run_dir is not None:
            return self._run_dir.path
        if PROCESS.current is None:
            raise missing("RunDir", "RequeueCheckpoint", _NEEDS_RUN_DIR)
        return PROCESS.current.path

    @property
    def checkpoint_dir(self) -> Path:
        """The directory holding ``last.ckpt``: ``dirpath``, or the run dir's ``checkpoints``."""
        if self._dirpath is None:
            return layout.checkpoint_dir(self._run())
        return expand_dir(self._dirpath, "RequeueCheckpoint(dirpath=...)")

    @property
    @override
    def ckpt_path(self) -> str:
        """``<run dir>/checkpoints/last.ckpt``; Lightning reads this when choosing what to resume."""
        return str(self.checkpoint_dir / f"{LAST}{self.FILE_EXTENSION}")

    @property
    def best_model_path(self) -> str:
        """What ``trainer.test(ckpt_path="best")`` loads when no ``ModelCheckpoint`` is given (Lightning
        leaves its default out beside ours): as that default would, the newest save; ``""`` before one."""
        try:
            return self.ckpt_path if exists(Path(self.ckpt_path)) else ""
        except LightningResumeError:  # no run dir yet
            return ""

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._run_dir = find_one(trainer, RunDir, "RequeueCheckpoint", _NEEDS_RUN_DIR)
        self._trainer = trainer
        # ckpt_path="best"/"last" as without us; the user's save_last never on our last.ckpt
        if self._quiet_best is not None:
            self._quiet_best.remove()
        self._quiet_best = model_checkpoint_first(trainer, self)
        keep_off_our_last(trainer, self.checkpoint_dir, LAST)
        if stage != "fit":
            return
        _warn_if_untested(trainer)
        self._logs.join(trainer, pl_module)  # unless the Trainer has its own
        self._check = CheckHooks.insert(trainer, self._run_dir.path, self._cadence)
        put_callback(trainer, self._boundary)
        self._exact.attach(
            trainer,
            before=trainer.checkpoint_callbacks[0],  # before every Checkpoint
            validated_after=layout.validated_after(self._run_dir.path),
            saves_mid_epoch=bool(self.every_n_train_steps or self.every_n_minutes),
            restart=self._run_dir.is_resumed,
            fingerprints=layout.self_check_dir(self._run_dir.path),
            on_verdict=attempts_of(self._run_dir).self_checked,
        )
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)  # every node, for a node-local dirpath
        self._writes.attach_memory(trainer, self.checkpoint_dir)
        self._writes.remove_partial(trainer)
        verify = functools.partial(self._writes.written_by, trainer)
        self._redirect.before_fit(
            trainer, self._run_dir, Path(self.ckpt_path), verify, self._writes.damaged(trainer)
        )
        rebuilds = trainer.world_size >= 3 and rebuilds_ddp_buckets(trainer.strategy)
        if rebuilds and self._run_dir.is_resumed and exists(Path(self.ckpt_path)):
            warn(_DDP_BUCKETS.format(world=trainer.world_size))

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._trainer is not None and restoring_tuner_checkpoint(self._trainer):
            return  # a tuner's search puts its own start back: not a save of ours
        step = state_dict.get("global_step")
        self._last_save_step = int(step) if step is not None else -1

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self._run_dir is not None
        self._cadence.start(trainer, attempts_of(self._run_dir))
        self._step_seen = trainer.global_step

    def _at_epoch_boundary(self, trainer: pl.Trainer) -> None:
        """As an epoch starts, before other callbacks (:class:`EpochBoundary`): restore or save here."""
        self._exact.at_epoch_boundary(trainer)
        due, self._save_at_boundary = self._save_at_boundary, False
        if due and not self._exact.stateful_loaders and trainer.global_step != self._last_save_step:
            self.save(trainer)
        for listener in self._boundary_listeners:
            listener(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Nothing is due inside an accumulation window: a save there would have to hold its gradients.
        stepped, self._step_seen = trainer.global_step != self._step_seen, trainer.global_step
        if trainer.is_last_batch:
            # Not a resume point: restored from here, Lightning would skip the epoch's end that follows.
            self._save_at_boundary |= self.save_on_train_epoch_end or self._due(trainer)
            return
        # Stateful loaders' position is restored only inside an epoch: saved after its first step.
        boundary = self._exact.stateful_loaders and batch_idx == 0
        if boundary and (self.save_on_train_epoch_end or self._save_at_boundary):
            self._save_at_boundary = False
            self.save(trainer)
        elif stepped and (self._due(trainer) or _last_step(trainer)) and not skips_backward(trainer):
            # (StochasticWeightAveraging's BatchNorm epoch: a restart inside it cannot be exact, and
            # redone from its start it costs one pass without backward)
            self.save(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != self._last_save_step:
            # A finished run's last.ckpt says so: a rerun has nothing left to do.
            self.save(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        exception = args[-1] if args else kwargs.get("exception")
        if isinstance(exception, SIGTERMException):
            # Raised at a batch boundary of training or of fit's validation: a resume point. In the sanity
            # check no training step has run (the restart runs it again: nothing to save).
            if trainer.validating and not trainer.sanity_checking:
                self.save_in_validation(trainer)  # the restart runs this validation again
            elif not trainer.sanity_checking:
                self.save(trainer, stopping=True)
        elif (
            not isinstance(exception, Preempted)  # saved already
            and trainer.state.fn == TrainerFn.FITTING  # not a failed validate/test/predict
            and trainer.is_global_zero
        ):
            last = Path(self.ckpt_path)
            kept = outlook(self._run(), last, elsewhere(trainer, last)[1])  # the rule a restart applies
            # Not saved now: an exception may come from the middle of a step, not a resume point.
            log.warning("fit stopped by %s; %s", type(exception).__name__, kept)
        self._after_fit(trainer, collective=False)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Before any teardown hook: RunDir gives the run dir up in its own, once nothing is written.
        self._after_fit(trainer, collective=True)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._after_fit(trainer, collective=True)

    def _after_fit(self, trainer: pl.Trainer, collective: bool) -> None:
        """Undo the redirect and filters; finish the sharded save in flight (``collective``: all ranks)."""
        self._redirect.after_fit()
        self._exact.detach(trainer)
        take_callback(trainer, self._boundary)
        self._writes.close(trainer, collective)

    def _due(self, trainer: pl.Trainer) -> bool:
        if trainer.global_step == self._last_save_step:
            return False  # gradient accumulation: no optimizer step since the last save
        return self._cadence.due(trainer, self._last_save_step)  # every N steps or minutes, or "auto"

    def save(self, trainer: pl.Trainer, stopping: bool = False) -> None:
        """Write ``last.ckpt`` now (call on every rank, at a resume point: a batch boundary, between
        epochs, or in fit's validation through :meth:`save_in_validation`); ``stopping``: this attempt
        trains no further step (the save then also fingerprints the batch the restart's first step takes)."""
        if stopping:
            with self._exact.stopping():
                self.save(trainer)
            return
        if skips_backward(trainer) and not trainer.is_last_batch:
            warn(
                "RequeueCheckpoint saves inside StochasticWeightAveraging's BatchNorm epoch (a preemption): "
                "Lightning does not set that epoch up again on a mid-epoch restart, so the resume from this "
                "save will not end with an uninterrupted run's weights (its self-check will say so). The "
                "epoch is one pass without backward: a grace window that lets it finish makes the next "
                "save exact."
            )
        self._cadence.timer.saving(trainer, self._writes.writer(trainer))
        with seeing_checkpoints(trainer, functools.partial(self._pickles.saving, trainer)):
            self._writes.write(trainer)
        self._mark_saved(trainer)
        self._cadence.saved()  # the stall; the time to durable now or once written
        log.debug("saved %s at step %s", self.ckpt_path, trainer.global_step)
        self._last_save_step = trainer.global_step
        if self._check is not None:
            self._check.saved(trainer)

    def save_in_validation(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` from inside fit's validation (every rank): the last training step's state,
        and the restart runs this validation again from its start."""
        with self._exact.saving_in_validation():
            self.save(trainer)

    def wait_until_durable(self, trainer: pl.Trainer) -> None:
        """Block until every checkpoint write in flight is on disk (plugins that write in the background)."""
        self._writes.wait_until_durable(trainer)  # every rank: PreemptionHandler calls it on all
        self._mark_saved(trainer)

    def _mark_saved(self, trainer: pl.Trainer) -> None:
        """Record that the run has a checkpoint (for the restart rule) once ``last.ckpt`` is committed."""
        if self._marked or not trainer.is_global_zero or not exists(Path(self.ckpt_path)):
            return
        record_saved(self._run())
        self._marked = True

    @override
    def state_dict(self) -> dict[str, Any]:
        """The step of the save (the random and data state is ``ExactResume``'s)."""
        return {"global_step": self._trainer.global_step if self._trainer else None}
