"""``ExactResume``: the random and data state of a run, saved in every checkpoint and put back exactly.

A private callback that ``RequeueCheckpoint`` puts just before itself for each ``fit`` (its state
between hooks: :class:`~.resume_state.ResumeState`); a run that does not resume draws exactly what it
draws without it. At train start go back the epoch's metrics (:mod:`.epoch_metrics`), the data position
(plain loaders: :mod:`.data_position`, :mod:`.worker_streams`; stateful ones under DDP:
:mod:`.stateful_loaders`) and a deferred stop (:mod:`.stop_request`); the random state as the next epoch
starts (a checkpoint between epochs), before the first resumed batch, or as a validation to redo starts;
under DDP, each rank's scheduler and callback states as Lightning loads them (:mod:`.per_rank_states`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_resume._collectives import gather_objects
from lightning_resume._compat.lightning import (
    NOT_RESUMABLE,
    QuietLightning,
    between_epochs,
    mark_between_epochs,
    put_callback,
    redo_validation_on_restart,
    replace_train_loader_states,
    restart_train_iterator,
    settle_fit_restart,
    settle_validation_progress,
    start_epoch_afresh,
    take_callback,
    train_loader_states,
    watch_train_loaders,
)
from lightning_resume._storage.atomic import write_text_atomic
from lightning_resume._warnings import warn
from lightning_resume.exact_resume import (
    data_position,
    epoch_metrics,
    per_rank_states,
    rng,
    stateful_loaders,
    stop_request,
)
from lightning_resume.exact_resume.resume_state import Loaded, RankState, ResumeState, Stage
from lightning_resume.exact_resume.worker_streams import ResumedWorkers
from lightning_resume.exact_resume.world_change import Positioned, WorldChange

log = logging.getLogger(__name__)


def _train_loaders(trainer: pl.Trainer | None) -> list[Any]:
    """The training loaders in Lightning's order (``CombinedLoader.flattened``, as its loader states)."""
    source = trainer.train_dataloader if trainer is not None else None
    return [] if source is None else list(CombinedLoader(source, "max_size_cycle").flattened)


def _plain(trainer: pl.Trainer | None) -> list[DataLoader]:
    return [dl for dl in _train_loaders(trainer) if isinstance(dl, DataLoader)]


class ExactResume(Callback):
    """Save and restore the random and data state of a run (private: ``RequeueCheckpoint`` inserts it);
    ``last_save_step``: the step ``RequeueCheckpoint`` saved last (``-1``: none yet)."""

    def __init__(self, keep_global_batch: bool, last_save_step: Callable[[], int]) -> None:
        self._world = WorldChange(keep_global_batch)  # another number of ranks (issue 25)
        self._last_save_step = last_save_step
        self.state = ResumeState()
        self._trainer: pl.Trainer | None = None
        self._validated_after: Path | None = None
        self._saves_mid_epoch = False
        self._restart = False  # this fit continues the run that saved what it loads
        self._stop_asked: Mapping[str, Any] | None = None  # the loaded stop request
        self._validation_rng: dict[str, Any] | None = None  # the random state as this validation started
        self._validation_metrics: dict[str, Any] | None = None  # the metric states as it started
        self._settle_restart = False  # a mid-epoch restore: Lightning's fit loop still "restarting"
        self._unwatch: Any = None  # removes the watch on the training loaders
        self._positioned = False  # plain loaders that this resume puts back at their batch
        self._stateful = False  # every train loader restores its own position
        self._loader_states: list[Any] | None = None  # this rank's saved loader states, to reload
        self._quiet: QuietLightning | None = None

    @property
    @override
    def state_key(self) -> str:
        return "ExactResume"

    @property
    def stateful_loaders(self) -> bool:
        """Whether every train loader restores its own position (known from train start on)."""
        return self._stateful

    def attach(
        self,
        trainer: pl.Trainer,
        before: Callback,
        validated_after: Path,
        saves_mid_epoch: bool,
        restart: bool,
    ) -> None:
        """In ``setup`` of ``fit``: join the callbacks just before ``before``; record every epoch's draws.
        ``validated_after`` records the step of the last save a validation followed."""
        put_callback(trainer, self, before=before)
        self._trainer, self._validated_after = trainer, validated_after
        self._saves_mid_epoch, self._restart = saves_mid_epoch, restart
        self._stop_watching()
        self._unwatch = watch_train_loaders(trainer, data_position.watch)

    def detach(self, trainer: pl.Trainer) -> None:
        """After ``fit``: out of the Trainer's callbacks, its filters and watch removed."""
        take_callback(trainer, self)
        self._unquiet()
        self._stop_watching()

    # -- saving ------------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """This rank's random and data state (every rank's are gathered in :meth:`on_save_checkpoint`)."""
        trainer = self._trainer
        in_validation = self.state.stage is Stage.SAVING_IN_VALIDATION and self._validation_rng is not None
        mine: RankState = {
            "rng": self._validation_rng if in_validation else rng.capture(),  # type: ignore[typeddict-item]
            "draws": [data_position.draws(dl) for dl in _plain(trainer)],
            "metrics": None,
        }
        if trainer is not None and trainer.lightning_module is not None:
            states = self._validation_metrics if in_validation else None
            mine["metrics"] = dict(epoch_metrics.capture(trainer, states))
        # Batches of the epoch whose step has run (what a mid-epoch resume skips).
        batches = (
            getattr(trainer.fit_loop.epoch_loop.batch_progress.current, "processed", 0) if trainer else 0
        )
        # Between epochs: the last epoch's end has run in full and nothing of the next; a save in
        # validation resumes inside the epoch (the validation and epoch-end hooks run again).
        between = trainer is not None and not in_validation and between_epochs(trainer)
        return {
            "ranks": [mine],  # every rank's, with its loader states, are gathered in at_save
            "mid_epoch": trainer is not None and not between,
            "between_epochs": between,
            "in_validation": in_validation,
            "batches": int(batches),
            **self._world.to_save(trainer, _train_loaders(trainer), int(batches)),  # issue 25
            **stop_request.to_save(trainer),
        }

    @contextlib.contextmanager
    def saving_in_validation(self) -> Iterator[None]:
        """Around a save from inside fit's validation (which changes no training state)."""
        self.state = self.state.saving_in_validation()
        try:
            yield
        finally:
            self.state = self.state.saved()

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """As Lightning builds a checkpoint (every rank): mark a validation to redo; every rank's states."""
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if state is None:
            return
        if state.get("in_validation"):
            redo_validation_on_restart(checkpoint)
        if state.get("between_epochs"):
            mark_between_epochs(checkpoint)
        if trainer.world_size > 1:
            mine = dict(state["ranks"][0])
            # Lightning keeps the saving rank's loader, scheduler and callback states only.
            mine["loaders"] = train_loader_states(checkpoint)
            mine["owned"] = per_rank_states.capture(checkpoint, self.state_key)
            state["ranks"] = gather_objects(trainer.strategy, mine)

    # -- restoring ---------------------------------------------------------------------------------

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Mark a validation to redo; give each rank its own loader, scheduler and callback states."""
        state = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        # Saved at the end of a step a validation followed: redo it from the checkpoint's random state
        # (nothing draws between the step's end and validation).
        followed = state.get("mid_epoch", True) and self._validation_followed(checkpoint.get("global_step"))
        if state and not state.get("in_validation") and followed and redo_validation_on_restart(checkpoint):
            state["before_validation"] = True
        ranks = state.get("ranks") or []
        # Another number of ranks: rank 0's states for everyone, as Lightning does (see world_change).
        same_ranks = trainer.world_size > 1 and len(ranks) == trainer.world_size
        if same_ranks:  # each rank decides on from its own scheduler and callback states
            per_rank_states.put_back(checkpoint, ranks[trainer.global_rank].get("owned"))
        if state and WorldChange.resplits(state, trainer):  # issue 25: the epoch's rest is split anew
            replace_train_loader_states(checkpoint, [])
        elif same_ranks:
            loaders = ranks[trainer.global_rank].get("loaders")
            if loaders is not None and replace_train_loader_states(checkpoint, loaders):
                self._loader_states = loaders if state.get("mid_epoch", True) else None

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the loaded states until their moments."""
        loaded = Loaded.from_state_dict(state_dict)
        if loaded is not None:
            self.state = self.state.load(loaded)
        self._world.load(state_dict)
        self._stop_asked = state_dict

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The epoch's metrics, the data back at its batch, the random state; a deferred stop again."""
        loaded = self.state.loaded
        redo_first = loaded is not None and loaded.before_validation
        loaders = self._inspect_loaders(trainer)
        if loaded is not None:
            epoch_metrics.restore(trainer, self._mine(trainer).get("metrics"), mid_epoch=loaded.mid_epoch)  # type: ignore[arg-type]
            self._settle_restart = loaded.mid_epoch
        # Issue 25: on another number of ranks, the rest of the epoch split over them.
        positioned = self._world.at_train_start(trainer, loaded, _train_loaders(trainer))
        if positioned is Positioned.RESPLIT:
            self._resplit(trainer)
        elif loaded is not None and loaded.mid_epoch and self._positioned:
            self._position_plain_loaders(trainer, loaders)
            self._continue_quietly(trainer)
        elif self._stateful and (trainer.world_size > 1 or positioned is Positioned.SAMPLER):
            self._position_stateful_loaders(trainer, changed=positioned is Positioned.SAMPLER)
        if redo_first:
            # The validation that followed the saved step runs first, from the state the step ended
            # with (plain loaders restored it above).
            if self.state.stage is Stage.LOADED:
                rng.restore(self._mine(trainer)["rng"])
            self.state = self.state.redo_validation_now()
        if stop_request.requested(self._stop_asked, restart=self._restart):
            trainer.should_stop = True
            log.info(
                "a stop asked for before step %s waits for min_steps/min_epochs: asked for again",
                trainer.global_step,
            )

    def at_epoch_boundary(self, trainer: pl.Trainer) -> None:
        """As an epoch starts, before its hooks: a checkpoint saved at this moment goes back, and Lightning
        starts the epoch as an uninterrupted run does (not "restarting")."""
        loaded = self.state.loaded
        if loaded is None or not loaded.between_epochs or self.state.stage is not Stage.LOADED:
            return
        rng.restore(self._mine(trainer)["rng"])
        start_epoch_afresh(trainer)
        self.state = self.state.applied()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Mid-epoch, the random state goes back now (after a stateful loader's iterator drew from it)."""
        self._unquiet()
        self._settle(trainer)
        self._continue(trainer, at_batch=True)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Before Lightning's plateau schedulers step."""
        self._settle(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation to redo starts from its saved random state; one that follows a save of this step
        is recorded, for a restart from that save to run it again (Lightning would skip it)."""
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        saved_at_this_step = trainer.global_step == self._last_save_step()
        loaded = self.state.loaded
        if loaded is not None and loaded.in_validation:
            self.state = self.state.redo_validation_from(self._mine(trainer)["rng"])
        if self.state.stage is Stage.VALIDATION_TO_REDO:
            assert self.state.rng is not None
            rng.restore(self.state.rng)
            self.state = self.state.redo_validation_now()
        self._validation_rng = rng.capture()
        self._validation_metrics = epoch_metrics.metric_states(trainer.lightning_module)
        if saved_at_this_step and trainer.is_global_zero:
            assert self._validated_after is not None
            write_text_atomic(self._validated_after, f"{trainer.global_step}\n")

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.state.stage is Stage.REDOING_VALIDATION:
            settle_validation_progress(trainer)
            self.state = self.state.validation_redone()

    # -- the pieces --------------------------------------------------------------------------------

    def _settle(self, trainer: pl.Trainer) -> None:
        if self._settle_restart:
            self._settle_restart = False
            settle_fit_restart(trainer)

    def _stop_watching(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    def _continue_quietly(self, trainer: pl.Trainer) -> None:
        """:meth:`_continue`, Lightning's "not resumable" warning silenced until the first batch (exact)."""
        self._unquiet()
        self._quiet = QuietLightning(self, NOT_RESUMABLE)
        self._continue(trainer, at_batch=False)

    def _continue(self, trainer: pl.Trainer, at_batch: bool) -> None:
        """Where the interrupted run was after its saved step: its random state, or the validation to
        redo (a checkpoint between epochs waits for :meth:`at_epoch_boundary`)."""
        loaded = self.state.loaded
        if loaded is None or loaded.between_epochs:
            return
        saved = self._mine(trainer)["rng"]
        if loaded.in_validation:  # the saved random state is that validation's start
            self.state = self.state.redo_validation_from(saved)
            return
        if at_batch or loaded.mid_epoch:
            rng.restore(saved)
        self.state = self.state.applied()

    def _inspect_loaders(self, trainer: pl.Trainer) -> list[DataLoader]:
        """The plain train loaders; who positions them; a warning for those nobody can position."""
        sources = _train_loaders(trainer)
        loaders = [dl for dl in sources if isinstance(dl, DataLoader)]
        stateful = [hasattr(dl, "state_dict") for dl in loaders]
        # Lightning restores a stateful loader only mid-epoch: their boundary is saved after a batch.
        self._stateful = bool(loaders) and all(stateful)
        problems = sorted({p for p in map(data_position.loader_problem, sources) if p})
        self._positioned = bool(loaders) and not problems and not any(stateful)
        if problems and self._saves_mid_epoch:
            warn(
                "RequeueCheckpoint saves mid-epoch, but the train data cannot be put back at the same batch ("
                + "; ".join(problems)
                + "): a resume from a mid-epoch last.ckpt continues at the right step with different "
                "batches. Alternatively save at epoch ends only (every_n_train_steps=None, "
                "every_n_minutes=None)."
            )
        return loaders

    def _position_plain_loaders(self, trainer: pl.Trainer, loaders: list[DataLoader]) -> None:
        """Make the interrupted epoch's iterator again from its recorded draws, skipping what it consumed."""
        loaded = self.state.loaded
        assert loaded is not None
        skip = loaded.batches
        # A save in the epoch-end validation consumed the whole epoch: skipping it all would leave an
        # exhausted iterator for the next epoch.
        if not 0 < skip < min((len(dl) for dl in loaders), default=0):
            return
        records = list(self._mine(trainer).get("draws") or [None] * len(loaders))
        if len(records) != len(loaders) or any(r is None or r.get("sampler") is None for r in records):
            warn(
                "RequeueCheckpoint cannot put the train data back at its batch: the checkpoint does not "
                "hold the random state the interrupted epoch was drawn from (saved before its first "
                "batch, or by another loader setup). Training continues at the right step with "
                "different batches."
            )
            return
        user_fns = [dl.worker_init_fn for dl in loaders]
        for loader, recorded in zip(loaders, records, strict=True):
            assert recorded is not None
            sampler: Any = loader.batch_sampler.sampler  # type: ignore[union-attr]
            sampler.set_epoch(trainer.current_epoch)  # Lightning sets it after this hook
            skipped = data_position.replay(loader, recorded, skip)
            if loader.num_workers:
                loader.worker_init_fn = ResumedWorkers(loader.worker_init_fn, skipped, loader.collate_fn)
        try:
            restart_train_iterator(trainer)
        finally:  # only this epoch's workers play their earlier selves
            for loader, user_fn in zip(loaders, user_fns, strict=True):
                loader.worker_init_fn = user_fn

    def _resplit(self, trainer: pl.Trainer) -> None:
        """The epoch's rest was split over the ranks (issue 25): a new iterator, this rank's random state."""
        self._loader_states = None
        restart_train_iterator(trainer)
        if self._positioned:
            self._continue_quietly(trainer)

    def _position_stateful_loaders(self, trainer: pl.Trainer, changed: bool = False) -> None:
        """Under DDP: an order of seed and epoch only, this rank's state, a new iterator (see
        :mod:`.stateful_loaders`); fresh runs go through this too, so both draw alike."""
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
        """Whether a validation ran after the save of ``step`` (recorded by :meth:`on_validation_start`)."""
        if self._validated_after is None:
            return False
        try:
            return int(self._validated_after.read_text().strip()) == step
        except (OSError, ValueError):
            return False
