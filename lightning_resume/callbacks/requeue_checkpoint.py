"""``RequeueCheckpoint``: an always-present ``last.ckpt`` and automatic, exact resume."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_resume._collectives import broadcast, gather_objects
from lightning_resume._resume import data_position, rng, stateful_loaders
from lightning_resume._resume.lightning_internals import (
    redo_validation_on_restart,
    replace_train_loader_states,
    restart_train_iterator,
    saves_directory,
    settle_validation_progress,
    train_loader_states,
)
from lightning_resume._resume.quiet_lightning import QuietLightning
from lightning_resume._resume.restart import Restart, decide, exists
from lightning_resume._run import layout
from lightning_resume._run.binding import PROCESS
from lightning_resume._run.paths import expand_dir
from lightning_resume._sharded.choice import prepare_resume
from lightning_resume._sharded.saver import DirectorySaver
from lightning_resume._storage.atomic import (
    create_text_exclusive,
    fsync_file,
    replace_durably,
    temp_sibling,
    write_text_atomic,
)
from lightning_resume._warnings import warn
from lightning_resume.callbacks.run_dir import RunDir
from lightning_resume.exceptions import MissingCallbackError, Preempted, ResumeError
from lightning_resume.io._protocol import AtomicCheckpointIO, settings_of
from lightning_resume.io._redirect_first_load import RedirectFirstLoad
from lightning_resume.io._redirect_first_strategy_load import RedirectFirstStrategyLoad

log = logging.getLogger(__name__)

LAST = layout.LAST


class EpochStart(TypedDict):
    """One rank's random state when its current epoch's iterator was made, and its loaders' generators."""

    rng: dict[str, Any]
    generators: list[list[torch.Tensor | None]] | None


class RankState(TypedDict, total=False):
    """What one rank stores in the checkpoint (the format of ``state_dict()["ranks"][i]``).

    ``loaders`` (under DDP) is this rank's training loader states, which Lightning keeps for the
    saving rank only.
    """

    rng: dict[str, Any]
    generators: list[list[torch.Tensor | None]]
    epoch_start: EpochStart | None
    loaders: list[Any] | None


@dataclass(frozen=True)
class PendingResume:
    """The loaded state still to be applied, from :meth:`RequeueCheckpoint.load_state_dict`.

    Attributes:
        ranks: Every rank's saved state, by global rank.
        mid_epoch: The checkpoint was written inside an epoch (not at its end).
        batches: Batches of that epoch already consumed.
        in_validation: The checkpoint was written during fit's validation (a preemption), which the
            restart runs again from its first batch, from the random state it started with.
        before_validation: The checkpoint was written at the end of a step that a validation
            followed; the restart runs that validation again, from the random state the checkpoint
            holds (restored before the validation draws anything).
    """

    ranks: list[RankState]
    mid_epoch: bool
    batches: int
    in_validation: bool = False
    before_validation: bool = False


def _train_loaders(trainer: pl.Trainer) -> list[Any]:
    """The training loaders in Lightning's order (``CombinedLoader.flattened``, as its loader states)."""
    source = trainer.train_dataloader
    return [] if source is None else list(CombinedLoader(source, "max_size_cycle").flattened)


def _loaders(source: Any) -> list[Any]:
    """The data loaders inside ``trainer.train_dataloader`` (one loader or a collection of them)."""
    if isinstance(source, dict):
        return [leaf for value in source.values() for leaf in _loaders(value)]
    if isinstance(source, (list, tuple)):
        return [leaf for value in source for leaf in _loaders(value)]
    return [source]


def _lost_save(partial: Path) -> OSError:
    """The error for a save Lightning reported done but did not write (its plugin swallows some errors)."""
    try:
        fd, probe = temp_sibling(partial)
    except OSError as e:
        error = OSError(
            e.errno,
            f"Could not save {str(partial)!r}: {e.strerror}. last.ckpt is intact; make "
            f"{str(partial.parent)!r} writable (and check its free space).",
            e.filename,
        )
        error.__cause__ = e
        return error
    os.close(fd)
    probe.unlink()
    return OSError(
        f"Lightning's checkpoint writer returned without writing {str(partial)!r} (it hides some errors). "
        "last.ckpt is intact; check the checkpoint directory's permissions and free space, or use "
        "DurableCheckpointIO, which reports the real error."
    )


def _writes_atomically(io: object) -> bool:
    return isinstance(io, AtomicCheckpointIO) and io.writes_atomically


def _epoch_start(loaders: list[DataLoader]) -> EpochStart:
    """The random state and the loaders' generators now, as an epoch's iterator is about to be made."""
    return {"rng": rng.capture(), "generators": [data_position.capture_generators(dl) for dl in loaders]}


def _batches_processed(trainer: pl.Trainer) -> int:
    """Batches of the current epoch whose step has run (what a mid-epoch resume must skip)."""
    return int(getattr(trainer.fit_loop.epoch_loop.batch_progress.current, "processed", 0))


class RequeueCheckpoint(OnExceptionCheckpoint):
    """Keep ``<run dir>/checkpoints/last.ckpt`` current and resume from it after a restart.

    ``last.ckpt`` is written every ``every_n_train_steps`` optimizer steps, every ``every_n_minutes``,
    at the end of every training epoch, and when ``fit`` stops on a preemption signal, whatever the
    user's own checkpoint callbacks do. Each write goes to a temporary file that is fsynced and
    renamed over the previous one, so a kill at any instant leaves a complete ``last.ckpt``.

    On a restart (see :class:`~lightning_resume.RunDir`) ``trainer.fit(model)`` resumes from it with the
    full state (weights, optimizers, schedulers, loops, callbacks), also when the user passes a
    ``ckpt_path`` (meant for the first attempt) or Lightning finds an ``hpc_ckpt_N.ckpt``. A restart
    with no ``last.ckpt`` starts from the beginning when the run never committed a checkpoint (it was
    stopped before its first save), and raises ``ResumeError`` when it did (starting over would
    silently discard the run). The checkpoint also carries every
    rank's Python, numpy and torch random state, restored exactly where the interrupted run was, so
    with a data loader that can resume mid-epoch (torchdata's ``StatefulDataLoader``) the final
    weights are bitwise equal to an uninterrupted run.

    Needs a :class:`~lightning_resume.RunDir` among the trainer's callbacks (in any order). With a
    ``checkpoint_io`` plugin that writes atomically (such as
    :class:`~lightning_resume.DurableCheckpointIO`), the plugin writes ``last.ckpt`` itself.

    Args:
        every_n_train_steps: Save every this many optimizer steps (``None``: not by steps).
        every_n_minutes: Save when this many minutes passed since the last save (``None``: not by time).
        save_on_train_epoch_end: Save at the end of every training epoch.
        dirpath: Where ``last.ckpt`` lives (default: ``<run dir>/checkpoints``; environment variables
            are expanded). For a node-local directory (``"$TMPDIR/ckpt"`` on a multi-node job) give
            ``DurableCheckpointIO(mirror=..., dirpath=...)`` the same directory: checkpoints are
            written locally and mirrored, and a job relaunched onto empty nodes gets them back from
            the mirror (once per node) when the plugin is constructed, before ``fit`` looks for
            ``last.ckpt``. The record that the run has saved (``checkpoints/.saved``) stays in the run
            dir.

    Raises:
        ValueError: for a non-positive interval.
        MissingCallbackError: at ``setup`` without exactly one ``RunDir`` in the Trainer.
        ResumeError: on a restart of a run that committed a checkpoint but has no ``last.ckpt``.

    Example::

        trainer = Trainer(callbacks=[RunDir(), RequeueCheckpoint(every_n_train_steps=200)])
        trainer.fit(model, datamodule=dm)  # resumes by itself after a requeue
    """

    def __init__(
        self,
        every_n_train_steps: int | None = None,
        every_n_minutes: float | None = None,
        save_on_train_epoch_end: bool = True,
        dirpath: str | Path | None = None,
    ) -> None:
        if every_n_train_steps is not None and (
            isinstance(every_n_train_steps, bool) or not isinstance(every_n_train_steps, int)
        ):
            raise TypeError(
                f"every_n_train_steps must be a whole number of steps or None, got {every_n_train_steps!r}."
            )
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(f"every_n_train_steps must be >= 1 or None, got {every_n_train_steps!r}.")
        if every_n_minutes is not None and (
            isinstance(every_n_minutes, bool) or not isinstance(every_n_minutes, (int, float))
        ):
            raise TypeError(f"every_n_minutes must be a number of minutes or None, got {every_n_minutes!r}.")
        if every_n_minutes is not None and not every_n_minutes > 0:
            raise ValueError(f"every_n_minutes must be > 0 or None, got {every_n_minutes!r}.")
        if not isinstance(save_on_train_epoch_end, bool):
            raise TypeError(
                f"save_on_train_epoch_end must be True or False, got {save_on_train_epoch_end!r}."
            )
        if dirpath is not None and (not isinstance(dirpath, (str, Path)) or not str(dirpath).strip()):
            raise ValueError(f"dirpath must be a directory path or None, got {dirpath!r}.")
        if dirpath is not None:
            expand_dir(dirpath, "RequeueCheckpoint(dirpath=...)")  # an unset variable: told now
        super().__init__(dirpath=".", filename=LAST)
        self._dirpath = dirpath  # Lightning's own ``dirpath`` attribute stays unused (ckpt_path is ours)
        self.every_n_train_steps = every_n_train_steps
        self.every_n_minutes = every_n_minutes
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self._run_dir: RunDir | None = None
        self._trainer: pl.Trainer | None = None
        self._pending: PendingResume | None = None
        self._epoch_start: EpochStart | None = None
        self._first_epoch = True
        self._positioned = False
        self._stateful_loader = False
        self._loader_states: list[Any] | None = None  # this rank's saved loader states, to reload
        self._validation_rng: dict[str, Any] | None = None  # the random state as this validation started
        self._saving_in_validation = False
        self._pending_validation_rng: dict[str, Any] | None = None  # restored as the redone validation starts
        self._redoing_validation = False
        self._epoch_ended = False
        self._last_save_step = -1
        self._marked = False  # checkpoints/.saved is known to exist
        self._warned_world_size = False
        self._last_save_time = time.monotonic()
        self._quiet = QuietLightning(self)
        self._saver: DirectorySaver | None = None  # sharded strategies: checkpoint directories
        self._strategy_redirect: RedirectFirstStrategyLoad | None = None

    def _run(self) -> tuple[Path, str]:
        """``(run dir, run id)`` of the Trainer's ``RunDir``, or of this process's before ``setup``."""
        if self._run_dir is not None:
            return self._run_dir.path, self._run_dir.run_id
        resolution = PROCESS.current
        if resolution is None:
            raise MissingCallbackError(
                "RequeueCheckpoint needs a RunDir callback in the same Trainer (it says where last.ckpt "
                "lives): add RunDir(root=...) to the callbacks.",
                needed="RunDir",
                needed_by="RequeueCheckpoint",
            )
        return resolution.path, resolution.run_id

    @property
    def checkpoint_dir(self) -> Path:
        """The directory holding ``last.ckpt``: ``dirpath``, or the run dir's ``checkpoints``."""
        if self._dirpath is None:
            return layout.checkpoint_dir(self._run()[0])
        return expand_dir(self._dirpath, "RequeueCheckpoint(dirpath=...)")

    @property
    @override
    def ckpt_path(self) -> str:
        """``<run dir>/checkpoints/last.ckpt``; Lightning reads this when choosing what to resume."""
        return str(self.checkpoint_dir / f"{LAST}{self.FILE_EXTENSION}")

    @property
    def saves_epoch_start_instead(self) -> bool:
        """Whether the epoch boundary is saved after the next epoch's first batch (stateful loaders)."""
        return self._stateful_loader

    @property
    def _saved_marker(self) -> Path:
        # In the run dir even when last.ckpt lives elsewhere (node-local): a restart on another node
        # must still know that the run has committed a checkpoint.
        return layout.saved_marker(self._run()[0])

    @property
    def _partial_path(self) -> Path:
        return self.checkpoint_dir / f".{LAST}{self.FILE_EXTENSION}.partial"

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        run_dirs = [cb for cb in trainer.callbacks if isinstance(cb, RunDir)]  # type: ignore[attr-defined]
        if len(run_dirs) != 1:
            raise MissingCallbackError(
                f"RequeueCheckpoint needs exactly one RunDir callback in the Trainer, found {len(run_dirs)}.",
                needed="RunDir",
                needed_by="RequeueCheckpoint",
            )
        self._run_dir = run_dirs[0]
        self._trainer = trainer
        if stage != "fit":
            return
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)  # every node, for a node-local dirpath
        if trainer.is_global_zero:
            with contextlib.suppress(FileNotFoundError):
                self._partial_path.unlink()
        if not self._run_dir.is_resumed:
            return
        # Rank 0 decides for all: a node-local view of the checkpoints must not split the ranks.
        last = Path(self.ckpt_path)
        restart = Restart(broadcast(trainer.strategy, decide(self._run_dir.path, last).value))
        if restart is Restart.START_OVER:
            # The previous attempt stopped before its first save (say, preempted while loading data):
            # there is nothing to resume and nothing to lose by starting over in the same run dir.
            log.info(
                "Restart of run %s, which stopped before its first checkpoint: starting from the beginning",
                self._run_dir.run_id,
            )
            return
        if restart is Restart.LOST:
            raise ResumeError(
                f"This is a restart of run {self._run_dir.run_id!r}, but {self.ckpt_path!r} does not exist "
                "although the run has saved checkpoints. Starting over would silently discard the run. "
                "Restore last.ckpt from a copy, or submit with another key to start a new run.",
                self.ckpt_path,
            )
        self._mark_saved(trainer)  # a run dir written before the marker existed gets it now
        strategy = trainer.strategy
        if broadcast(strategy, last.is_dir()):
            # A sharded checkpoint: verified here (no CheckpointIO sees its load), and the strategy's
            # own load is redirected.
            choice = prepare_resume(trainer, last, settings_of(strategy.checkpoint_io).directories_kept)
            self._strategy_redirect = RedirectFirstStrategyLoad(
                strategy,
                self.ckpt_path,
                self._warn_redirect,
                choice.manifest.world_size if choice.manifest is not None else trainer.world_size,
                trainer.world_size,
            )
            self._strategy_redirect.install()
        else:
            strategy.checkpoint_io = RedirectFirstLoad(
                strategy, strategy.checkpoint_io, self.ckpt_path, self._warn_redirect
            )
        log.info("Restart of run %s: resuming from %s", self._run_dir.run_id, self.ckpt_path)

    def _warn_redirect(self, requested: str) -> None:
        warn(
            f"Restart of a preempted run: resuming from {self.ckpt_path!r} instead of {requested!r} "
            "(a ckpt_path given to fit() only applies to the first attempt of a run).",
            all_ranks=True,
        )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # At an epoch boundary the next draws are the new epoch's iterator and shuffle, which
        # happen before any batch hook: put the random state back before them.
        if self._pending is not None and not self._pending.mid_epoch:
            rng.restore(self._mine(trainer)["rng"])
        self._first_epoch = True

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        before_validation = self._pending is not None and self._pending.before_validation
        sources = _loaders(trainer.train_dataloader)
        loaders = [dl for dl in sources if isinstance(dl, DataLoader)]
        # Lightning restores a stateful loader only when resuming mid-epoch, so for those the epoch
        # boundary is saved as the first batch of the next epoch instead (see on_train_batch_end).
        self._stateful_loader = bool(loaders) and all(hasattr(dl, "state_dict") for dl in loaders)
        problems = sorted({p for p in map(data_position.loader_problem, sources) if p})
        self._positioned = (
            bool(loaders) and not problems and not any(hasattr(dl, "state_dict") for dl in loaders)
        )
        mid_epoch_saves = self.every_n_train_steps is not None or self.every_n_minutes is not None
        if problems and mid_epoch_saves:
            warn(
                "RequeueCheckpoint saves mid-epoch, but the train data cannot be put back at the same batch ("
                + "; ".join(problems)
                + "): a resume from a mid-epoch last.ckpt continues at the right step with different "
                "batches. Alternatively save at epoch ends only (every_n_train_steps=None, "
                "every_n_minutes=None)."
            )
        if self._positioned:
            self._position_loaders(trainer, loaders)
        elif self._stateful_loader and trainer.world_size > 1:
            self._position_stateful_loaders(trainer)
        if before_validation:
            # The validation that followed the saved step runs first: it must draw from the state the
            # step ended with, as it did in the interrupted run (plain loaders restored it above).
            if self._pending is not None:
                rng.restore(self._mine(trainer)["rng"])
                self._pending = None
            self._redoing_validation = True

    def _position_stateful_loaders(self, trainer: pl.Trainer) -> None:
        """Under DDP: an order that depends on seed and epoch only, this rank's state, a new iterator.

        Lightning made the first iterator in ``FitLoop.setup_data``, before ``set_epoch`` and with the
        sampler it wrapped (see ``_resume.stateful_loaders``); fresh runs go through this too, so both
        runs draw alike.
        """
        loaders = [dl for dl in _train_loaders(trainer) if isinstance(dl, DataLoader)]
        changed = False
        for loader in loaders:
            changed |= stateful_loaders.unwrap_random_sampler(loader)
            problem = stateful_loaders.hidden_sampler_problem(loader)
            if problem:
                warn(f"RequeueCheckpoint cannot resume the train data exactly: {problem}.")
            for sampler in stateful_loaders.distributed_samplers(loader):
                if sampler.epoch != trainer.current_epoch:
                    sampler.set_epoch(trainer.current_epoch)
                    changed = True
        states, self._loader_states = self._loader_states, None
        if not changed:
            return  # Lightning's iterator already starts where this rank's state says
        if states is not None:
            stateful: list[Any] = [dl for dl in loaders if stateful_loaders.is_stateful(dl)]
            for loader, state in zip(stateful, states, strict=True):
                loader.load_state_dict(state)
        restart_train_iterator(trainer)

    def _position_loaders(self, trainer: pl.Trainer, loaders: list[DataLoader]) -> None:
        """Rebuild the first epoch's iterator from a known state, skipping what a resumed run consumed.

        Fresh runs go through this too, so the uninterrupted and the resumed run draw alike.
        """
        pending = self._pending
        mine = self._mine(trainer) if pending is not None else None
        skip = 0
        start: EpochStart
        if pending is not None and mine is not None and pending.mid_epoch and mine.get("epoch_start"):
            start = mine["epoch_start"]  # type: ignore[assignment]  # checked just above
            skip = pending.batches
        elif mine is not None:
            start = {"rng": mine["rng"], "generators": mine.get("generators")}
        else:
            start = _epoch_start(loaders)
        rng.restore(start["rng"])
        for loader, states in zip(loaders, start.get("generators") or [], strict=False):
            data_position.restore_generators(loader, states)
        self._epoch_start = start
        for loader in loaders:
            data_position.seed_workers_per_batch(loader, trainer.global_rank)
        epoch = trainer.current_epoch
        # A save during the epoch-end validation has consumed the whole epoch: nothing to skip (a skip
        # of everything would leave an exhausted iterator for the next epoch to pick up).
        skippers = [data_position.skip_batches(dl, skip, epoch) for dl in loaders if 0 < skip < len(dl)]
        restart_train_iterator(trainer)
        for skipper in skippers:
            skipper.start()
        if pending is not None and mine is not None:
            if pending.in_validation:
                self._pending_validation_rng = mine["rng"]  # restored as the redone validation starts
            elif pending.mid_epoch:
                rng.restore(mine["rng"])  # where the interrupted run was after its last saved step
            self._pending = None

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._first_epoch or not self._positioned:
            return  # the first epoch's iterator was made (and its start recorded) in on_train_start
        loaders = [dl for dl in _loaders(trainer.train_dataloader) if isinstance(dl, DataLoader)]
        for loader in loaders:  # reloaded loaders (reload_dataloaders_every_n_epochs) need it again
            data_position.seed_workers_per_batch(loader, trainer.global_rank)
        self._epoch_start = _epoch_start(loaders)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Mid-epoch with a stateful loader, the resumed iterator is rebuilt before this hook and
        # draws from the global generator; restoring now continues the stream where it was.
        if self._pending is not None:
            if self._pending.in_validation:
                # Saved during validation: the random state belongs to that validation's start.
                self._pending_validation_rng = self._mine(trainer)["rng"]
            else:
                rng.restore(self._mine(trainer)["rng"])
            self._pending = None

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self._pending is not None and self._pending.in_validation:
            self._pending_validation_rng = self._mine(trainer)["rng"]
            self._pending = None
        if self._pending_validation_rng is not None:
            # The validation a preemption interrupted runs again, from the same random state.
            rng.restore(self._pending_validation_rng)
            self._pending_validation_rng = None
            self._redoing_validation = True
        self._validation_rng = rng.capture()
        if trainer.global_step == self._last_save_step and trainer.is_global_zero:
            # last.ckpt was saved at this step, before this validation: a restart from it must run
            # the validation again (Lightning would skip it, and the random draws it made with it).
            write_text_atomic(self._validated_after, f"{trainer.global_step}\n")

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._redoing_validation:
            settle_validation_progress(trainer)
            self._redoing_validation = False

    def save_in_validation(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` from inside fit's validation (call on every rank).

        Validation changes no training state, so this is the state of the last training step; the
        restart runs this validation again from its first batch and its starting random state.
        """
        self._saving_in_validation = True
        try:
            self.save(trainer)
        finally:
            self._saving_in_validation = False

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.is_last_batch and (self.save_on_train_epoch_end or self._stateful_loader):
            return  # the epoch-end save follows, or (stateful loader) the first batch of the next epoch
        epoch_start = self._stateful_loader and self.save_on_train_epoch_end and batch_idx == 0
        if epoch_start or self._due(trainer):
            self.save(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_epoch = False
        if self.save_on_train_epoch_end and not self._stateful_loader:
            self.save(trainer, epoch_ended=True)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != self._last_save_step:
            # A finished run's last.ckpt says so: a rerun has nothing left to do.
            self.save(trainer, epoch_ended=True)

    @override
    def on_exception(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        exception = args[-1] if args else kwargs.get("exception")
        if isinstance(exception, Preempted):
            self._close_saver(trainer, collective=False)
            return  # PreemptionHandler saved last.ckpt before raising
        if isinstance(exception, SIGTERMException):
            self.save(trainer)  # raised at a batch boundary, so the state is consistent
        elif trainer.is_global_zero:
            if exists(Path(self.ckpt_path)):
                kept = f"{self.ckpt_path} keeps its last save"
            else:
                kept = f"no checkpoint was saved yet, so a restart starts over (nothing at {self.ckpt_path})"
            # Not saved now: an exception may come from the middle of a step, not a resume point.
            log.warning("fit stopped by %s; %s", type(exception).__name__, kept)
        self._close_saver(trainer, collective=False)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        io = trainer.strategy.checkpoint_io
        if isinstance(io, RedirectFirstLoad):
            io.uninstall()
        self._close_saver(trainer, collective=True)

    def _close_saver(self, trainer: pl.Trainer, collective: bool) -> None:
        """Finish the sharded save in flight and stop its writer (``collective``: every rank is here)."""
        if self._strategy_redirect is not None:
            self._strategy_redirect.uninstall()
            self._strategy_redirect = None
        saver, self._saver = self._saver, None
        if saver is not None:
            saver.close(trainer, collective=collective)

    def _due(self, trainer: pl.Trainer) -> bool:
        step = trainer.global_step
        if step == self._last_save_step:
            return False  # gradient accumulation: no optimizer step since the last save
        due = bool(self.every_n_train_steps and step % self.every_n_train_steps == 0)
        if self.every_n_minutes is not None:
            elapsed = time.monotonic() - self._last_save_time >= self.every_n_minutes * 60
            # Clocks differ between ranks: rank 0 decides for all of them.
            due = due or bool(broadcast(trainer.strategy, elapsed))
        return due

    def save(self, trainer: pl.Trainer, epoch_ended: bool = False) -> None:
        """Write ``last.ckpt`` now (call on every rank). Used by the hooks and by preemption handling.

        A ``checkpoint_io`` that declares ``writes_atomically = True`` (such as
        :class:`~lightning_resume.DurableCheckpointIO`) writes ``last.ckpt`` itself; with any other plugin
        the checkpoint goes to a temporary file that is fsynced and renamed over ``last.ckpt``.

        Args:
            trainer: The trainer.
            epoch_ended: The training epoch has ended (Lightning resumes at the next one).
        """
        # An epoch can end before its last batch (max_steps, limit_train_batches): Lightning then
        # resumes at the next epoch, so the random state belongs to an epoch boundary.
        self._epoch_ended = epoch_ended or trainer.is_last_batch
        if saves_directory(trainer.strategy) is not False:
            # Sharded strategies write a directory, bypassing checkpoint_io: written aside, then committed.
            if self._saver is None:
                self._saver = DirectorySaver.for_trainer(
                    trainer, Path(self.ckpt_path), on_commit=lambda: self._mark_saved(trainer)
                )
            self._saver.save(trainer)
        elif _writes_atomically(trainer.strategy.checkpoint_io):
            trainer.save_checkpoint(self.ckpt_path, weights_only=False)
        else:
            partial = self._partial_path
            trainer.save_checkpoint(partial, weights_only=False)
            if trainer.is_global_zero:
                if not partial.is_file():
                    raise _lost_save(partial)
                fsync_file(partial)
                replace_durably(partial, self.ckpt_path)
        self._mark_saved(trainer)
        log.debug("saved %s at step %s", self.ckpt_path, trainer.global_step)
        self._epoch_ended = False
        self._last_save_step = trainer.global_step
        self._last_save_time = time.monotonic()

    def wait_until_durable(self, trainer: pl.Trainer) -> None:
        """Block until every checkpoint write in flight is on disk (plugins that write in the background)."""
        io = trainer.strategy.checkpoint_io
        if isinstance(io, AtomicCheckpointIO):
            io.wait_until_durable()
        if self._saver is not None:
            self._saver.wait_until_durable(trainer)  # every rank: PreemptionHandler calls it on all
        self._mark_saved(trainer)

    def _mark_saved(self, trainer: pl.Trainer) -> None:
        """Record, once ``last.ckpt`` is committed, that the run has a checkpoint (the restart rule).

        A plugin that writes in the background commits a save later than it returns: the marker
        waits for the file, so a kill before the first commit leaves a run that starts over.
        """
        if self._marked or not trainer.is_global_zero or not exists(Path(self.ckpt_path)):
            return
        self._saved_marker.parent.mkdir(parents=True, exist_ok=True)
        create_text_exclusive(self._saved_marker, "")
        self._marked = True

    @override
    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        loaders = (
            [dl for dl in _loaders(trainer.train_dataloader) if isinstance(dl, DataLoader)] if trainer else []
        )
        in_validation = self._saving_in_validation and self._validation_rng is not None
        mine: RankState = {
            "rng": self._validation_rng if in_validation else rng.capture(),  # type: ignore[typeddict-item]
            "generators": [data_position.capture_generators(dl) for dl in loaders],
            "epoch_start": self._epoch_start,
        }
        # Every rank's states are gathered in on_save_checkpoint, with the loader states Lightning took.
        return {
            "ranks": [mine],
            # A save in validation resumes inside the epoch, also after its last batch: the
            # validation, then the epoch-end hooks, run again.
            "mid_epoch": trainer is not None
            and (in_validation or not (self._epoch_ended or trainer.is_last_batch)),
            "in_validation": in_validation,
            "batches": _batches_processed(trainer) if trainer else 0,
            "global_step": trainer.global_step if trainer else None,
        }

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if state is None:
            return
        if state.get("in_validation"):
            redo_validation_on_restart(checkpoint)
        if trainer.world_size > 1:
            mine = dict(state["ranks"][0])
            # Lightning keeps only the saving rank's loader states; each rank needs its own back.
            mine["loaders"] = train_loader_states(checkpoint)
            state["ranks"] = gather_objects(trainer.strategy, mine)

    @property
    def _validated_after(self) -> Path:
        return layout.validated_after(self._run()[0])

    def _validation_followed(self, step: Any) -> bool:
        """Whether a validation ran after the save of ``step`` (recorded by ``on_validation_start``)."""
        try:
            return int(self._validated_after.read_text().strip()) == step
        except (OSError, ValueError):
            return False

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        state = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        followed = self._validation_followed(checkpoint.get("global_step"))
        # Saved at the end of a step that a validation followed: redo that validation, from the
        # random state the checkpoint holds (nothing draws between the step's end and validation).
        if state and not state.get("in_validation") and followed and redo_validation_on_restart(checkpoint):
            state["before_validation"] = True
        ranks = state.get("ranks") or []
        if trainer.world_size <= 1 or len(ranks) != trainer.world_size:
            return  # rank 0's loader states for everyone (the world size changed: _mine warns)
        loaders = ranks[trainer.global_rank].get("loaders")
        if loaders is not None and replace_train_loader_states(checkpoint, loaders):
            self._loader_states = loaders if state.get("mid_epoch", True) else None

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("ranks"):
            self._pending = PendingResume(
                ranks=list(state_dict["ranks"]),
                mid_epoch=bool(state_dict.get("mid_epoch", True)),
                batches=int(state_dict.get("batches", 0)),
                in_validation=bool(state_dict.get("in_validation", False)),
                before_validation=bool(state_dict.get("before_validation", False)),
            )
            self._warned_world_size = False
        step = state_dict.get("global_step")
        self._last_save_step = int(step) if step is not None else -1

    def _mine(self, trainer: pl.Trainer) -> RankState:
        """This rank's saved states (rank 0's, with one warning, if the world size changed)."""
        assert self._pending is not None
        ranks = self._pending.ranks
        if len(ranks) == trainer.world_size:
            return ranks[trainer.global_rank]
        if not self._warned_world_size:
            self._warned_world_size = True
            warn(
                f"The checkpoint holds random states for {len(ranks)} rank(s) but this run has "
                f"{trainer.world_size}: continuing with rank 0's, so random draws will not match an "
                "uninterrupted run."
            )
        return ranks[0]
