"""``ExactResume``: the random and data state of a run, saved in every checkpoint and put back exactly.

``RequeueCheckpoint`` calls one method per moment of ``fit``; between moments the state is one
:class:`~lightning_resume._resume.resume_state.ResumeState`. What goes back when:

- the data position, at train start: plain loaders' first epoch is rebuilt from its epoch-start
  random state and skips the consumed batches (:mod:`.data_position`); stateful loaders under DDP get
  their own rank's state, the epoch and an order Lightning does not hide (:mod:`.stateful_loaders`);
- the random state: before the next epoch's iterator (a checkpoint at an epoch boundary), just before
  the first resumed batch (mid-epoch), or as the validation to redo starts;
- a validation the checkpoint interrupted, or that followed the saved step (recorded in
  ``checkpoints/.validated-after``), runs again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch.utils.data import DataLoader

from lightning_resume._collectives import gather_objects
from lightning_resume._resume import data_position, rng, stateful_loaders
from lightning_resume._resume.lightning_internals import (
    redo_validation_on_restart,
    replace_train_loader_states,
    restart_train_iterator,
    settle_validation_progress,
    train_loader_states,
)
from lightning_resume._resume.quiet_lightning import NOT_RESUMABLE, QuietLightning
from lightning_resume._resume.resume_state import EpochStart, Loaded, RankState, ResumeState, Stage
from lightning_resume._resume.world_change import Positioned, WorldChange
from lightning_resume._storage.atomic import write_text_atomic
from lightning_resume._warnings import warn


def _train_loaders(trainer: pl.Trainer | None) -> list[Any]:
    """The training loaders in Lightning's order (``CombinedLoader.flattened``, as its loader states)."""
    source = trainer.train_dataloader if trainer is not None else None
    return [] if source is None else list(CombinedLoader(source, "max_size_cycle").flattened)


def _plain(trainer: pl.Trainer | None) -> list[DataLoader]:
    return [dl for dl in _train_loaders(trainer) if isinstance(dl, DataLoader)]


def _epoch_start(loaders: list[DataLoader]) -> EpochStart:
    """The random state and the loaders' generators now, as an epoch's iterator is about to be made."""
    return {"rng": rng.capture(), "generators": [data_position.capture_generators(dl) for dl in loaders]}


class ExactResume:
    """Save and restore the random and data state; ``state_key`` is the callback's in the checkpoint.

    ``keep_global_batch``: see :class:`~lightning_resume._resume.world_change.WorldChange`.
    """

    def __init__(self, state_key: str, keep_global_batch: bool = False) -> None:
        self.state_key = state_key
        self._world = WorldChange(keep_global_batch)  # another number of ranks (issue 25)
        self.state = ResumeState()
        self._validated_after: Path | None = None
        self._epoch_start: EpochStart | None = None
        self._validation_rng: dict[str, Any] | None = None  # the random state as this validation started
        self._first_epoch = True
        self._positioned = False  # plain loaders that this resume puts back at their batch
        self._stateful = False  # every train loader restores its own position
        self._loader_states: list[Any] | None = None  # this rank's saved loader states, to reload
        self._quiet: QuietLightning | None = None

    @property
    def stateful_loaders(self) -> bool:
        """Whether every train loader restores its own position (known from train start on)."""
        return self._stateful

    # -- saving ------------------------------------------------------------------------------------

    def state_to_save(self, trainer: pl.Trainer | None, epoch_ended: bool) -> dict[str, Any]:
        """This rank's part of the callback's ``state_dict`` (``epoch_ended``: saved at an epoch end)."""
        in_validation = self.state.stage is Stage.SAVING_IN_VALIDATION and self._validation_rng is not None
        mine: RankState = {
            "rng": self._validation_rng if in_validation else rng.capture(),  # type: ignore[typeddict-item]
            "generators": [data_position.capture_generators(dl) for dl in _plain(trainer)],
            "epoch_start": self._epoch_start,
        }
        # Batches of the current epoch whose step has run (what a mid-epoch resume must skip).
        batches = (
            getattr(trainer.fit_loop.epoch_loop.batch_progress.current, "processed", 0) if trainer else 0
        )
        return {
            "ranks": [mine],  # every rank's, with its loader states, are gathered in at_save
            # A save in validation resumes inside the epoch, also after its last batch: the
            # validation, then the epoch-end hooks, run again.
            "mid_epoch": trainer is not None
            and (in_validation or not (epoch_ended or trainer.is_last_batch)),
            "in_validation": in_validation,
            "batches": int(batches),
            **self._world.to_save(trainer, _train_loaders(trainer), int(batches)),  # issue 25
        }

    @contextlib.contextmanager
    def saving_in_validation(self) -> Iterator[None]:
        """Around a save from inside fit's validation (which changes no training state)."""
        self.state = self.state.saving_in_validation()
        try:
            yield
        finally:
            self.state = self.state.saved()

    def at_save(self, trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
        """As Lightning builds a checkpoint (every rank): mark a validation to redo; every rank's states."""
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

    # -- restoring ---------------------------------------------------------------------------------

    def before_fit(self, validated_after: Path) -> None:
        """In ``setup``: the file that records the step of the last save a validation followed."""
        self._validated_after = validated_after

    def after_load(self, trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
        """In ``on_load_checkpoint``: mark a validation to redo; give each rank its own loader states."""
        state = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        # Saved at the end of a step that a validation followed: redo that validation, from the
        # random state the checkpoint holds (nothing draws between the step's end and validation).
        followed = self._validation_followed(checkpoint.get("global_step"))
        if state and not state.get("in_validation") and followed and redo_validation_on_restart(checkpoint):
            state["before_validation"] = True
        ranks = state.get("ranks") or []
        if state and WorldChange.resplits(state, trainer):  # issue 25: the epoch's rest is split anew
            replace_train_loader_states(checkpoint, [])
            return
        if trainer.world_size <= 1 or len(ranks) != trainer.world_size:
            return  # rank 0's loader states for everyone (the world size changed: see world_change)
        loaders = ranks[trainer.global_rank].get("loaders")
        if loaders is not None and replace_train_loader_states(checkpoint, loaders):
            self._loader_states = loaders if state.get("mid_epoch", True) else None

    def load(self, state_dict: dict[str, Any]) -> None:
        """In ``load_state_dict``: keep the loaded states until their moments."""
        loaded = Loaded.from_state_dict(state_dict)
        if loaded is not None:
            self.state = self.state.load(loaded)
        self._world.load(state_dict)

    def after_restore(self, trainer: pl.Trainer) -> None:
        """In ``on_fit_start``: at an epoch boundary the random state goes back now, before the next
        epoch's iterator and shuffle draw from it (they come before any batch hook)."""
        loaded = self.state.loaded
        if loaded is not None and not loaded.mid_epoch:
            rng.restore(self._mine(trainer)["rng"])
        self._first_epoch = True

    def at_train_start(self, trainer: pl.Trainer, saves_mid_epoch: bool) -> None:
        """In ``on_train_start``: the data back at its batch, then the random state."""
        redo_first = self.state.loaded is not None and self.state.loaded.before_validation
        loaders = self._inspect_loaders(trainer, saves_mid_epoch)
        # Issue 25: on another number of ranks, the rest of the epoch split over them.
        positioned = self._world.at_train_start(trainer, self.state.loaded, _train_loaders(trainer))
        if positioned is Positioned.RESPLIT:
            self._resplit(trainer, loaders)
        elif self._positioned:
            self._position_plain_loaders(trainer, loaders)
            self._unquiet()
            self._quiet = QuietLightning(self, NOT_RESUMABLE)  # until the first batch: the position is exact
            self._continue(trainer, at_batch=False)
        elif self._stateful and (trainer.world_size > 1 or positioned is Positioned.SAMPLER):
            self._position_stateful_loaders(trainer, changed=positioned is Positioned.SAMPLER)
        if redo_first:
            # The validation that followed the saved step runs first: it must draw from the state the
            # step ended with, as it did in the interrupted run (plain loaders restored it above).
            if self.state.stage is Stage.LOADED:
                rng.restore(self._mine(trainer)["rng"])
            self.state = self.state.redo_validation_now()

    def at_epoch_start(self, trainer: pl.Trainer) -> None:
        """In ``on_train_epoch_start``: a later epoch's start (the first one's is taken at train start)."""
        if self._first_epoch or not self._positioned:
            return
        loaders = _plain(trainer)
        for loader in loaders:  # reloaded loaders (reload_dataloaders_every_n_epochs) need it again
            data_position.seed_workers_per_batch(loader, trainer.global_rank)
        self._epoch_start = _epoch_start(loaders)

    def before_batch(self, trainer: pl.Trainer) -> None:
        """In ``on_train_batch_start``: mid-epoch, the random state goes back now. A stateful loader's
        resumed iterator is rebuilt before this hook, drawing from the global generator."""
        self._unquiet()
        self._continue(trainer, at_batch=True)

    def at_epoch_end(self) -> None:
        self._first_epoch = False

    def before_validation(self, trainer: pl.Trainer, saved_at_this_step: bool) -> None:
        """In ``on_validation_start``: a validation to redo starts from its saved random state.

        ``saved_at_this_step``: ``last.ckpt`` was saved at this step, before this validation; a
        restart from it must run the validation again (Lightning would skip it and its random draws).
        """
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        loaded = self.state.loaded
        if loaded is not None and loaded.in_validation:
            self.state = self.state.redo_validation_from(self._mine(trainer)["rng"])
        if self.state.stage is Stage.VALIDATION_TO_REDO:
            assert self.state.rng is not None
            rng.restore(self.state.rng)
            self.state = self.state.redo_validation_now()
        self._validation_rng = rng.capture()
        if saved_at_this_step and trainer.is_global_zero:
            assert self._validated_after is not None
            write_text_atomic(self._validated_after, f"{trainer.global_step}\n")

    def after_validation(self, trainer: pl.Trainer) -> None:
        if self.state.stage is Stage.REDOING_VALIDATION:
            settle_validation_progress(trainer)
            self.state = self.state.validation_redone()

    def after_fit(self) -> None:
        self._unquiet()

    # -- the pieces --------------------------------------------------------------------------------

    def _continue(self, trainer: pl.Trainer, at_batch: bool) -> None:
        """Where the interrupted run was after its saved step: its random state, or the validation to
        redo. At train start only a mid-epoch state goes back (an epoch boundary's already did)."""
        loaded = self.state.loaded
        if loaded is None:
            return
        saved = self._mine(trainer)["rng"]
        if loaded.in_validation:  # the saved random state is that validation's start
            self.state = self.state.redo_validation_from(saved)
            return
        if at_batch or loaded.mid_epoch:
            rng.restore(saved)
        self.state = self.state.applied()

    def _inspect_loaders(self, trainer: pl.Trainer, saves_mid_epoch: bool) -> list[DataLoader]:
        """The plain train loaders; who positions them; a warning for those nobody can position."""
        sources = _train_loaders(trainer)
        loaders = [dl for dl in sources if isinstance(dl, DataLoader)]
        stateful = [hasattr(dl, "state_dict") for dl in loaders]
        # Lightning restores a stateful loader only when resuming mid-epoch, so for those the epoch
        # boundary is saved as the first batch of the next epoch instead.
        self._stateful = bool(loaders) and all(stateful)
        problems = sorted({p for p in map(data_position.loader_problem, sources) if p})
        self._positioned = bool(loaders) and not problems and not any(stateful)
        if problems and saves_mid_epoch:
            warn(
                "RequeueCheckpoint saves mid-epoch, but the train data cannot be put back at the same batch ("
                + "; ".join(problems)
                + "): a resume from a mid-epoch last.ckpt continues at the right step with different "
                "batches. Alternatively save at epoch ends only (every_n_train_steps=None, "
                "every_n_minutes=None)."
            )
        return loaders

    def _position_plain_loaders(self, trainer: pl.Trainer, loaders: list[DataLoader]) -> None:
        """Rebuild the first epoch's iterator from a known state, skipping what a resumed run consumed.
        Fresh runs go through this too, so the uninterrupted and the resumed run draw alike."""
        loaded = self.state.loaded
        mine = self._mine(trainer) if loaded is not None else None
        skip = 0
        start: EpochStart
        if loaded is not None and mine is not None and loaded.mid_epoch and mine.get("epoch_start"):
            start = mine["epoch_start"]  # type: ignore[assignment]  # checked just above
            skip = loaded.batches
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
        # A save during the epoch-end validation has consumed the whole epoch: nothing to skip (a skip
        # of everything would leave an exhausted iterator for the next epoch to pick up).
        epoch = trainer.current_epoch
        skippers = [data_position.skip_batches(dl, skip, epoch) for dl in loaders if 0 < skip < len(dl)]
        restart_train_iterator(trainer)
        for skipper in skippers:
            skipper.start()

    def _resplit(self, trainer: pl.Trainer, loaders: list[DataLoader]) -> None:
        """The epoch's rest was split over the ranks (issue 25): a new iterator; plain loaders get
        their random state back now, as when positioned."""
        for loader in loaders:
            data_position.seed_workers_per_batch(loader, trainer.global_rank)
        self._epoch_start = _epoch_start(loaders)
        self._loader_states = None
        restart_train_iterator(trainer)
        if self._positioned:
            self._unquiet()
            self._quiet = QuietLightning(self, NOT_RESUMABLE)
            self._continue(trainer, at_batch=False)

    def _position_stateful_loaders(self, trainer: pl.Trainer, changed: bool = False) -> None:
        """Under DDP: an order that depends on seed and epoch only, this rank's state, a new iterator.

        Lightning made the first iterator in ``FitLoop.setup_data``, before ``set_epoch`` and with the
        sampler it wrapped (see :mod:`.stateful_loaders`); fresh runs go through this too, so both
        runs draw alike.
        """
        loaders = _plain(trainer)
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

    def _mine(self, trainer: pl.Trainer) -> RankState:
        """This rank's saved states (on another number of ranks, the rule of ``rank_states``)."""
        assert self.state.loaded is not None
        return self._world.rank_state(self.state.loaded.ranks, trainer)

    def _unquiet(self) -> None:
        quiet, self._quiet = self._quiet, None
        if quiet is not None:
            quiet.remove()

    def _validation_followed(self, step: Any) -> bool:
        """Whether a validation ran after the save of ``step`` (recorded by :meth:`before_validation`)."""
        if self._validated_after is None:
            return False
        try:
            return int(self._validated_after.read_text().strip()) == step
        except (OSError, ValueError):
            return False
