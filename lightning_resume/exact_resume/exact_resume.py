"""``ExactResume``: the private callback of ``RequeueCheckpoint`` that saves the random and data state in
every checkpoint and puts each back at its moment; a run that does not resume draws exactly as without it."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, StochasticWeightAveraging
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_resume._collectives import gather_objects
from lightning_resume._compat.lightning import (
    NOT_RESUMABLE,
    QuietLightning,
    between_epochs,
    forget_train_loader,
    instead_of_tuner_search,
    load_pending_train_loader_states,
    mark_between_epochs,
    modes_before_validation,
    next_step_uses_held_grads,
    next_train_batch,
    put_back_tuner_result,
    put_back_validation_log_steps,
    put_callback,
    redo_validation_on_restart,
    replace_train_loader_states,
    restart_swa_epochs,
    restart_train_iterator,
    restoring_tuner_checkpoint,
    settle_fit_restart,
    settle_validation_progress,
    start_epoch_afresh,
    take_callback,
    train_loader_mode,
    train_loader_states,
    transfer_hooks_overridden,
    tuner_result,
    tuners,
    validation_log_steps,
    watch_train_loaders,
)
from lightning_resume._compat.torch import end_persistent_workers
from lightning_resume._storage.atomic import write_text_atomic
from lightning_resume._warnings import warn
from lightning_resume.exact_resume import (
    data_position,
    epoch_metrics,
    held_grads,
    per_rank_states,
    persistent_workers,
    rng,
    self_check,
    stateful_loaders,
    stop_request,
    trainable,
)
from lightning_resume.exact_resume.resume_state import Loaded, RankState, ResumeState, Stage
from lightning_resume.exact_resume.worker_streams import ResumedWorkers
from lightning_resume.exact_resume.world_change import Positioned, WorldChange

log = logging.getLogger(__name__)


@dataclass
class _Recording:
    """The uninterrupted run's first step after the save at ``saved_at``: its fingerprint so far."""

    saved_at: list[int]
    fingerprint: self_check.Fingerprint


@dataclass(frozen=True)
class _Checking:
    """The first resumed step: the ``fields`` compared, what differs, what the interrupted run's produced."""

    step: int | None
    fields: list[str]
    found: list[str]
    outcome: dict[str, Any] | None


def _train_loaders(trainer: pl.Trainer) -> list[Any]:
    """The training loaders in Lightning's order (``CombinedLoader.flattened``, as its loader states)."""
    source = trainer.train_dataloader
    return [] if source is None else list(CombinedLoader(source, "max_size_cycle").flattened)


def _write_next(*args: Any) -> None:
    """:func:`.self_check.write_next` off the training thread (its file is a hint: never an error)."""
    try:
        self_check.write_next(*args)
    except OSError as e:
        log.debug("self-check fingerprint not written: %s", e)


def _plain(trainer: pl.Trainer) -> list[DataLoader]:
    return [dl for dl in _train_loaders(trainer) if isinstance(dl, DataLoader)]


def _workers_to_save(trainer: pl.Trainer, batches: int, between: bool) -> list[Any]:
    """Each plain loader's persistent workers, as a resume starts them (:mod:`.persistent_workers`)."""
    loaders = _plain(trainer)
    lengths = [None if data_position.is_iterable(dl) else len(dl) for dl in loaders]
    owns = data_position.positions(batches, lengths, train_loader_mode(trainer))
    return [
        persistent_workers.save(dl, own, between or (n is not None and own >= n))
        for dl, own, n in zip(loaders, owns, lengths, strict=True)
    ]


class ExactResume(Callback):
    """Save and restore a run's random and data state; ``last_save_step``: the step saved last (-1: none)."""

    def __init__(self, keep_global_batch: bool, last_save_step: Callable[[], int]) -> None:
        self._world = WorldChange(keep_global_batch)  # another number of ranks (issue 25)
        self._last_save_step = last_save_step
        self.state = ResumeState()
        self._trainer: pl.Trainer | None = None
        self._validated_after: Path | None = None  # holds the step of the last save a validation followed
        self._saves_mid_epoch = False
        self._restart = False  # this fit continues the run that saved what it loads
        self._stop_asked: Mapping[str, Any] | None = None  # the loaded stop request
        self._validation_rng: dict[str, Any] | None = None  # the random state as this validation started
        self._validation_metrics: dict[str, Any] | None = None  # the metric states as it started
        self._settle_restart = False  # a mid-epoch restore: Lightning's fit loop still "restarting"
        self._unwatch: Any = None  # removes the watch on the training loaders
        self._positioned = False  # plain loaders that this resume puts back at their batch
        self.stateful_loaders = False  # every train loader restores its own position (from train start on)
        self._loader_states: list[Any] | None = None  # this rank's saved loader states, to reload
        self._quiet: QuietLightning | None = None
        self._fingerprints: Path | None = None  # the uninterrupted run's first steps after a save
        self._on_verdict: Callable[[str], None] = lambda verdict: None
        self._loaded_step: int | None = None  # the global step of the loaded checkpoint
        self._check_pending: Loaded | None = None  # what the first resumed step checks itself against
        self._checking: _Checking | None = None  # the first resumed step, its inputs compared
        self._next_taken = -1  # the save whose next step's fingerprint is recorded
        self._recording: _Recording | None = None  # that step, its inputs taken, until it ends
        self._writer: threading.Thread | None = None  # writes its record
        self._stopping = False  # the save under way is a stop's (the next step runs in the restart)
        self._tuners_back: list[Callable[[], None]] = []  # gives the tuners their searches back
        self._saved_at = [-1, -1]  # the last save's [global step, batches of the epoch or -1 between]
        self._grads: list[Any] | None = None  # saved gradients the first resumed step adds to
        self._val_log_steps: tuple[int, dict[int, int]] | None = None  # (epoch, steps) to continue
        self._validation_log_steps: dict[int, int] = {}  # as this validation started

    @property
    @override
    def state_key(self) -> str:
        return "ExactResume"

    def attach(
        self,
        trainer: pl.Trainer,
        before: Callback,
        validated_after: Path,
        saves_mid_epoch: bool,
        restart: bool,
        fingerprints: Path,
        on_verdict: Callable[[str], None],
    ) -> None:
        """In ``setup`` of ``fit``: join the callbacks just before ``before``; record every epoch's draws."""
        put_callback(trainer, self, before=before)
        self._trainer, self._validated_after = trainer, validated_after
        self._fingerprints, self._on_verdict = fingerprints, on_verdict
        self._saves_mid_epoch, self._restart = saves_mid_epoch, restart
        self._loaded_step = None
        self._stop_watching()
        self._unwatch = watch_train_loaders(trainer, data_position.watch)

    def detach(self, trainer: pl.Trainer) -> None:
        """After ``fit``: out of the Trainer's callbacks, its filters and watch removed."""
        take_callback(trainer, self)
        self._unquiet()
        self._stop_watching()
        for give_back in self._tuners_back:
            give_back()
        self._tuners_back = []

    @override
    def state_dict(self) -> dict[str, Any]:
        """This rank's random and data state (every rank's are gathered in :meth:`on_save_checkpoint`)."""
        trainer = self._trainer
        assert trainer is not None, "saved during fit only"
        module = trainer.lightning_module
        in_validation = self.state.stage is Stage.SAVING_IN_VALIDATION and self._validation_rng is not None
        # Batches of the epoch whose step has run (what a mid-epoch resume skips).
        batches = int(getattr(trainer.fit_loop.epoch_loop.batch_progress.current, "processed", 0))
        # Between epochs: the last epoch's end has run in full and nothing of the next; a save in
        # validation resumes inside the epoch (the validation and epoch-end hooks run again).
        between = not in_validation and between_epochs(trainer)
        mine: RankState = {
            "rng": self._validation_rng if in_validation else rng.capture(),  # type: ignore[typeddict-item]
            "draws": [data_position.draws(dl) for dl in _plain(trainer)],
            "datasets": [rng.generator_states(dl.dataset) for dl in _plain(trainer)],
            "workers": _workers_to_save(trainer, batches, between),
            "metrics": dict(
                epoch_metrics.capture(trainer, self._validation_metrics if in_validation else None)
            ),
            "frozen": trainable.frozen(module),
            # in a validation, the modes it gives back as it ends
            "modes": trainable.modes(module, modes_before_validation(trainer) if in_validation else None),
            # in a validation, as it started: the restart runs it again
            "val_log_steps": self._validation_log_steps if in_validation else validation_log_steps(trainer),
        }
        # which save: with gradient accumulation, saves share a step (-1: a save between epochs or in
        # a validation, which carries no fingerprint)
        fingerprinted = not (between or in_validation)
        self._saved_at = [trainer.global_step, batches if fingerprinted else -1]
        if fingerprinted:
            mine["check"] = self._fingerprint(trainer, batches)
            if self._stopping:  # the next step runs in the restart only: its batch, taken now
                self._add_next_batch(trainer, mine["check"])
        if not in_validation and self._next_step_uses_grads(trainer, 0 if between else batches):
            mine["grads"] = held_grads.capture(module)
        return {
            "ranks": [mine],  # every rank's, with its loader states, are gathered in on_save_checkpoint
            "mid_epoch": not between,
            "between_epochs": between,
            "in_validation": in_validation,
            "batches": batches,
            **self._world.to_save(trainer, _train_loaders(trainer), batches),  # issue 25
            **stop_request.to_save(trainer),
            "tuned": [tuner_result(tuner, module) for tuner in tuners(trainer)],
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

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Mark a validation to redo; give each rank its own loader, scheduler and callback states."""
        if restoring_tuner_checkpoint(trainer):
            return  # a tuner's search puts its own start back: no resume
        state = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        step = checkpoint.get("global_step")
        self._loaded_step = int(step) if isinstance(step, int) else None
        # Saved at the end of a step a validation followed: redo it from the checkpoint's random state
        # (nothing draws between the step's end and validation).
        followed = state.get("mid_epoch", True) and self._validation_followed(step)
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
        """Keep the loaded states until their moments; the tuners' searches stay done."""
        trainer = self._trainer
        if trainer is not None and restoring_tuner_checkpoint(trainer):
            return
        loaded = Loaded.from_state_dict(state_dict)
        if loaded is not None:
            self.state = self.state.load(loaded)
            if trainer is not None:
                self._skip_tuner_searches(trainer, state_dict.get("tuned"))
        self._world.load(state_dict)
        self._stop_asked = state_dict

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The epoch's metrics, the data back at its batch, the random state; a deferred stop again."""
        loaded = self.state.loaded
        redo_first = loaded is not None and loaded.before_validation
        loaders = self._inspect_loaders(trainer)
        if loaded is not None:
            mine = self._mine(trainer)
            epoch_metrics.restore(trainer, mine.get("metrics"), mid_epoch=loaded.mid_epoch)  # type: ignore[arg-type]
            self._settle_restart = loaded.mid_epoch
            if loaded.mid_epoch and not loaded.between_epochs and restart_swa_epochs(trainer):
                log.info("StochasticWeightAveraging's epoch start run again (skipped on a mid-epoch restart)")
            self._check_pending = loaded if self._restart and self._loaded_step is not None else None
            self._grads = mine.get("grads")
            if self._restart:
                self._put_back_trainable(trainer, mine)
                steps = mine.get("val_log_steps")
                self._val_log_steps = None if steps is None else (trainer.current_epoch, steps)
        if loaded is not None and load_pending_train_loader_states(trainer):
            restart_train_iterator(trainer)  # Lightning's #21765: its loader was made too early
            log.info("the train loaders' restored states loaded (Lightning made the loaders before them)")
        # Issue 25: on another number of ranks, the rest of the epoch split over them.
        positioned = self._world.at_train_start(trainer, loaded, _train_loaders(trainer))
        if positioned is Positioned.RESPLIT:  # a new iterator; this rank's random state
            self._loader_states = None
            restart_train_iterator(trainer)
            if self._positioned:
                self._continue_quietly(trainer)
        elif loaded is not None and loaded.mid_epoch and self._positioned:
            self._position_plain_loaders(trainer, loaders, loaded.batches)
            self._continue_quietly(trainer)
        elif self.stateful_loaders and (trainer.world_size > 1 or positioned is Positioned.SAMPLER):
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
        """As an epoch starts, before its hooks: a checkpoint saved at this moment goes back (as if fresh)."""
        loaded = self.state.loaded
        if loaded is None or not loaded.between_epochs or self.state.stage is not Stage.LOADED:
            return
        mine = self._mine(trainer)
        rng.restore(mine["rng"])
        for loader, states in zip(_plain(trainer), mine.get("datasets") or [], strict=False):
            rng.set_generator_states(loader.dataset, states)  # the next epoch draws on as the run's would
        self._restart_workers(trainer, _plain(trainer), None)
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
        grads, self._grads = self._grads, None
        if grads is not None and not held_grads.restore(pl_module, grads):
            warn(
                "RequeueCheckpoint cannot put back the gradients the saved step held: the model's "
                "parameters differ."
            )
        if self._check_pending is not None:
            self._check(trainer, self._check_pending, batch, batch_idx)
        elif trainer.global_step == self._last_save_step() != self._next_taken:
            self._record_next(trainer, batch, batch_idx)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """The first step after a save (or the first resumed one) ended: what it produced."""
        if self._recording is not None:
            self._finish_record(trainer, outputs)
        if self._checking is not None:
            self._finish_check(trainer, outputs)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Before Lightning's plateau schedulers step."""
        self._settle(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation to redo starts from its saved random state; one after a save at this step is noted."""
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        # The first validation after a restart logs its steps on from the interrupted run's.
        pending, self._val_log_steps = self._val_log_steps, None
        reloads = getattr(trainer, "reload_dataloaders_every_n_epochs", 0)
        if pending is not None and (not reloads or trainer.current_epoch == pending[0]):
            put_back_validation_log_steps(trainer, pending[1])
        saved_at_this_step = trainer.global_step == self._last_save_step()
        loaded = self.state.loaded
        if loaded is not None and loaded.in_validation:
            self.state = self.state.redo_validation_from(self._mine(trainer)["rng"])
        if self.state.stage is Stage.VALIDATION_TO_REDO:
            assert self.state.rng is not None
            rng.restore(self.state.rng)
            self.state = self.state.redo_validation_now()
        self._validation_rng = rng.capture()
        self._validation_log_steps = validation_log_steps(trainer)
        self._validation_metrics = epoch_metrics.metric_states(trainer.lightning_module)
        if saved_at_this_step and trainer.is_global_zero:
            assert self._validated_after is not None
            write_text_atomic(self._validated_after, f"{trainer.global_step}\n")

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.state.stage is Stage.REDOING_VALIDATION:
            settle_validation_progress(trainer)
            self.state = self.state.validation_redone()

    @staticmethod
    def _put_back_trainable(trainer: pl.Trainer, saved: RankState) -> None:
        """``requires_grad``, modes and ``track_running_stats`` as saved (``BaseFinetuning`` set them)."""
        module = trainer.lightning_module
        frozen = saved.get("frozen")
        unfrozen = [] if frozen is None else trainable.put_back(module, frozen)
        for what, changed in (
            ("requires_grad of %d parameter(s)", unfrozen),
            ("the mode of %d submodule(s)", trainable.put_back_modes(module, saved.get("modes"))),
        ):
            if changed and trainer.is_global_zero:
                log.info(
                    what + " put back as saved (set otherwise since: %s%s)",
                    len(changed),
                    ", ".join(changed[:3]),
                    ", ..." if len(changed) > 3 else "",
                )

    def _skip_tuner_searches(self, trainer: pl.Trainer, tuned: Any) -> None:
        """The tuners put their saved results back instead of searching again (and restoring step 0)."""
        found = tuners(trainer)
        if not isinstance(tuned, list) or len(tuned) != len(found):
            return
        for tuner, result in zip(found, tuned, strict=True):

            def instead(tuner: Callback = tuner, result: dict[str, Any] = result) -> None:
                put_back_tuner_result(tuner, trainer.lightning_module, result)
                forget_train_loader(trainer)  # made again with the tuned settings
                if trainer.is_global_zero:
                    log.info(
                        "%s does not search again on a resume: its result is put back (%s = %r)",
                        type(tuner).__name__,
                        result.get("attribute"),
                        result.get("value"),
                    )

            self._tuners_back.append(instead_of_tuner_search(tuner, instead))

    def _fingerprint(
        self, trainer: pl.Trainer, batch_idx: int, batch: Any = None
    ) -> self_check.Fingerprint | None:
        """This rank's fingerprint (``None`` where it cannot be taken: never a reason to stop training)."""
        if trainer.lightning_module is None or trainer.state.fn != "fit":
            return None
        try:
            uses_grads = next_step_uses_held_grads(trainer, batch_idx)
            return self_check.take(trainer, batch_idx, uses_grads, batch)
        except Exception as e:  # an odd model or batch: unchecked
            log.debug("no self-check fingerprint: %s", e)
            return None

    @staticmethod
    def _next_step_uses_grads(trainer: pl.Trainer, batch_idx: int) -> bool:
        """Whether the step at ``batch_idx`` adds to the gradients held now (or SWA's BatchNorm epoch's)."""
        epoch = trainer.current_epoch  # (an epoch boundary: the epoch about to start)
        callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
        swa = [cb for cb in callbacks if isinstance(cb, StochasticWeightAveraging)]
        if batch_idx == 0 and any(epoch == getattr(cb, "swa_end", -2) + 1 for cb in swa):
            return True
        return next_step_uses_held_grads(trainer, batch_idx)

    def _record_next(self, trainer: pl.Trainer, batch: Any, batch_idx: int) -> None:
        """The uninterrupted run's first step after a save: its fingerprint, written now and as it ends."""
        self._next_taken = trainer.global_step
        fingerprint = self._fingerprint(trainer, batch_idx, batch)
        if fingerprint is not None and self._fingerprints is not None:
            self._recording = _Recording(list(self._saved_at), fingerprint)
            args = (self._fingerprints, trainer.global_rank, self._recording.saved_at, fingerprint)
            self._writer = threading.Thread(target=_write_next, args=args, name="self-check", daemon=True)
            self._writer.start()

    def _finish_record(self, trainer: pl.Trainer, outputs: Any) -> None:
        """The step ended: its record again, with what it produced (written now, once per save)."""
        recording, self._recording = self._recording, None
        assert recording is not None
        if self_check.deterministic(trainer.lightning_module):  # else it may differ in any run
            fingerprint = dict(recording.fingerprint)
            fingerprint["outcome"] = self_check.outcome(trainer.lightning_module, outputs)
            if self._writer is not None:
                self._writer.join()
            _write_next(self._fingerprints, trainer.global_rank, recording.saved_at, fingerprint)

    def _add_next_batch(self, trainer: pl.Trainer, check: self_check.Fingerprint | None) -> None:
        """A stop's save: the batch the next step takes (in the restart), as the loader gives it."""
        if check is None or transfer_hooks_overridden(trainer):
            return
        try:
            batch = next_train_batch(trainer)
        except Exception as e:  # never a reason to fail a stop's save
            log.debug("no self-check batch at the stop: %s", e)
            return
        if batch is not None:
            check["batch"] = self_check.batch_digest(batch)

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """Around a save after which this attempt trains no more (a preemption's stop)."""
        self._stopping = True
        try:
            yield
        finally:
            self._stopping = False

    def _check(self, trainer: pl.Trainer, loaded: Loaded, batch: Any, batch_idx: int) -> None:
        """The first resumed step, as it starts: its inputs compared with the interrupted run's."""
        self._check_pending = None
        self._next_taken = trainer.global_step
        step = self._loaded_step
        fields: list[str] = []
        found: list[str] = []
        saved: self_check.Fingerprint | None = None
        if step is not None and trainer.global_step != step:
            fields, found = ["position"], [self_check.position_lost(step, trainer.global_step)]
        elif step is not None and len(loaded.ranks) == trainer.world_size:
            now = self._fingerprint(trainer, batch_idx, batch)
            assert self._fingerprints is not None
            at_save = loaded.ranks[trainer.global_rank].get("check")
            saved_at = [step, at_save["position"][2] if at_save else -1]
            saved = self_check.read_next(self._fingerprints, trainer.global_rank, saved_at)
            candidates: Sequence[str] = sorted(saved) if saved is not None else self_check.AT_SAVE
            if saved is None and loaded.mid_epoch and not (loaded.before_validation or loaded.in_validation):
                saved = at_save
            if now is not None and saved is not None:
                fields = [field for field in candidates if field in saved and field in now]
                found = self_check.differences(saved, now, fields)
        outcome = saved.get("outcome") if saved is not None and not found else None
        self._checking = _Checking(step, fields, found, outcome)

    def _finish_check(self, trainer: pl.Trainer, outputs: Any) -> None:
        """The first resumed step ended: what it produced compared too; the verdict (warned on rank 0)."""
        checking, self._checking = self._checking, None
        assert checking is not None
        fields, found = list(checking.fields), list(checking.found)
        if checking.outcome is not None:
            now = {"outcome": self_check.outcome(trainer.lightning_module, outputs)}
            fields.append("outcome")
            found += self_check.differences({"outcome": checking.outcome}, now, ["outcome"])
        by_rank = gather_objects(trainer.strategy, found) if trainer.world_size > 1 else [found]
        if not trainer.is_global_zero:
            return
        if not fields:
            self._on_verdict("unchecked")
            return
        self._on_verdict(self_check.verdict(by_rank, fields))
        step = checking.step
        if any(by_rank):
            warn(self_check.message(step or 0, by_rank))
        else:
            log.info("resume self-check after step %s: exact (%s compared)", step, ", ".join(sorted(fields)))

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
        """Where the interrupted run was after its saved step: its random state, or the validation to redo."""
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
        self.stateful_loaders = bool(loaders) and all(stateful)
        problems = sorted({p for p in map(data_position.loader_problem, sources) if p})
        self._positioned = bool(loaders) and not problems and not any(stateful)
        if any(data_position.persistent(dl) and persistent_workers.recording(dl) is None for dl in sources):
            warn(
                "A train loader has persistent_workers=True with workers lightning_resume does not record "
                "(an IterableDataset, a StatefulDataLoader or in_order=False): their random streams "
                "(augmentation) go on from epoch to epoch, and the fresh workers of a resumed run draw "
                "others. For an exact resume use a map-style dataset, persistent_workers=False, or draw "
                "the augmentation from a generator seeded by the sample index and the epoch."
            )
        elif problems and self._saves_mid_epoch:
            warn(
                "RequeueCheckpoint saves mid-epoch, but the train data cannot be put back at the same batch ("
                + "; ".join(problems)
                + "): a resume from a mid-epoch last.ckpt continues at the right step with different "
                "batches. Alternatively save at epoch ends only (every_n_train_steps=None, "
                "every_n_minutes=None)."
            )
        return loaders

    def _restart_workers(
        self, trainer: pl.Trainer, loaders: list[DataLoader], owns: list[int] | None
    ) -> None:
        """Persistent workers made anew from their saved states: in the round of ``owns``, or next epoch."""
        saved = self._mine(trainer).get("workers") or []
        for i, (loader, workers) in enumerate(zip(loaders, saved, strict=False)):
            init = persistent_workers.recording(loader)
            if init is None or workers is None:
                continue
            end_persistent_workers(loader)
            next_epoch = owns is None or owns[i] >= len(loader)
            init.restart(workers["entries"], workers["states"], workers["round_start"], next_epoch)
            if next_epoch:  # the new workers' iterator stands in for the reset of the old one
                data_position.make_next_quietly(loader)

    def _position_plain_loaders(self, trainer: pl.Trainer, loaders: list[DataLoader], skip: int) -> None:
        """Make the interrupted epoch's iterator again from its recorded draws, skipping ``skip`` batches."""
        # A save in the epoch-end validation consumed the whole epoch: skipping it all would leave an
        # exhausted iterator for the next epoch.
        if not 0 < skip < trainer.num_training_batches:
            if skip:
                self._restart_workers(trainer, loaders, None)  # for the next epoch
            return
        iterable = [data_position.is_iterable(dl) for dl in loaders]
        lengths = [None if it else len(dl) for dl, it in zip(loaders, iterable, strict=True)]
        owns = data_position.positions(skip, lengths, train_loader_mode(trainer))
        mine = self._mine(trainer)
        records = list(mine.get("draws") or [None] * len(loaders))
        needed = ["iterator" if it else "sampler" for it in iterable]
        if len(records) != len(loaders) or any(
            r is None or r.get(key) is None for r, key in zip(records, needed, strict=False)
        ):
            warn(
                "RequeueCheckpoint cannot put the train data back at its batch: the checkpoint does not "
                "hold the random state the interrupted epoch was drawn from (saved before its first "
                "batch, or by another loader setup). Training continues at the right step with "
                "different batches."
            )
            return
        user_fns = [dl.worker_init_fn for dl in loaders]
        saved = list(mine.get("workers") or [])
        saved += [None] * (len(loaders) - len(saved))
        self._restart_workers(trainer, loaders, owns)
        replayed = 0
        for loader, recorded, own, drawn_again, workers in zip(
            loaders, records, owns, iterable, saved, strict=False
        ):
            assert recorded is not None
            if drawn_again:
                replayed += own if data_position.replay_iterable(loader, recorded, own) else 0
                continue
            sampler: Any = loader.batch_sampler.sampler  # type: ignore[union-attr]
            sampler.set_epoch(trainer.current_epoch)  # Lightning sets it after this hook
            if workers is not None and persistent_workers.recording(loader) is not None:
                start = workers["round_start"]  # the round made again, its given batches dropped
                data_position.replay(loader, recorded, start, drop=own - start)
                continue
            skipped = data_position.replay(loader, recorded, own)
            if loader.num_workers:
                loader.worker_init_fn = ResumedWorkers(loader.worker_init_fn, skipped, loader.collate_fn)
        started = time.perf_counter()
        try:
            restart_train_iterator(trainer)
        finally:  # only this epoch's workers play their earlier selves
            for loader, user_fn in zip(loaders, user_fns, strict=True):
                loader.worker_init_fn = user_fn
        if replayed and trainer.is_global_zero:
            log.info(
                "an IterableDataset without state is back at its batch: %d batch(es) of the epoch drawn "
                "again and dropped in %.2f s",
                replayed,
                time.perf_counter() - started,
            )

    def _position_stateful_loaders(self, trainer: pl.Trainer, changed: bool = False) -> None:
        """Under DDP: an order of seed and epoch, this rank's state, a new iterator (fresh runs alike)."""
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
        """This rank's saved states (on another number of ranks, the rule of ``world_change_rng``)."""
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
