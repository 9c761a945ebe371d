"""Every touch of Lightning's internals, for what Lightning offers no public route.

One named function (or class) per touch: private attributes and classes read or written, methods of
Lightning's objects stood in for, the Trainer's callback list changed, and the texts of Lightning's
warnings matched. Pinned by ``tests/_compat/test_lightning.py``: when Lightning changes, that test
fails loudly. Nothing outside ``lightning_resume._compat`` touches Lightning's internals
(``tests/_compat/test_seam.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint
from lightning.pytorch.loggers import CometLogger, CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.strategies import Strategy

# -- the checkpoint Lightning resumes from --------------------------------------------------------------


class LastCheckpointCallback(OnExceptionCheckpoint):
    """The base of a callback whose ``ckpt_path`` Lightning resumes ``fit`` from (``RequeueCheckpoint``).

    Lightning's checkpoint connector (``_CheckpointConnector._parse_ckpt_path``) treats an
    ``OnExceptionCheckpoint`` in the Trainer's callbacks specially: with ``fit(ckpt_path=None)`` it
    switches to ``"last"``, and ``"last"`` considers each such callback's ``ckpt_path`` (with every
    ``ModelCheckpoint``'s ``last*.ckpt``, newest first). Being a ``Checkpoint`` also keeps Lightning from
    adding its default ``ModelCheckpoint`` (``_CallbackConnector._configure_checkpoint_callbacks``), and
    puts the callback after all others in hook order. A subclass overrides the ``ckpt_path`` property.
    """

    def __init__(self) -> None:
        super().__init__(dirpath=".", filename="last")  # Lightning's dirpath and filename stay unused

    @property
    def ckpt_path(self) -> str:
        raise NotImplementedError


# -- methods of Lightning's objects, stood in for ---------------------------------------------------------


#: What a :class:`NextLoad` runs instead: ``handler(original, path, args, kwargs)``.
LoadHandler = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


class NextLoad:
    """Stands in for ``strategy.load_checkpoint`` (an instance attribute) until its first call.

    Lightning reads a checkpoint through ``Strategy.load_checkpoint`` once per stage, every strategy
    alike (sharded ones call no ``CheckpointIO``). The first call removes the stand-in and runs
    ``handler(original, path, args, kwargs)``; :meth:`uninstall` removes it when nothing was loaded.
    """

    def __init__(self, strategy: Strategy, handler: LoadHandler) -> None:
        self.strategy = strategy
        self.handler = handler
        self.original = strategy.load_checkpoint

    def install(self) -> None:
        self.strategy.load_checkpoint = self  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self.strategy.__dict__.get("load_checkpoint") is self:
            del self.strategy.load_checkpoint

    def __call__(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        self.uninstall()
        return self.handler(self.original, checkpoint_path, args, kwargs)


def put_callback(trainer: pl.Trainer, callback: Callback, before: Callback | None = None) -> None:
    """Put ``callback`` into the Trainer's callbacks for this ``fit``: first, or just before ``before``.

    Lightning calls ``trainer.callbacks`` in list order and offers no public way to add one after
    construction. A new list: Lightning may be iterating the old one.
    """
    callbacks = [c for c in trainer.callbacks if c is not callback]  # type: ignore[attr-defined]
    at = callbacks.index(before) if before is not None and before in callbacks else 0
    trainer.callbacks = [*callbacks[:at], callback, *callbacks[at:]]  # type: ignore[attr-defined]


def take_callback(trainer: pl.Trainer, callback: Callback) -> None:
    """Take ``callback`` out of the Trainer's callbacks again."""
    trainer.callbacks = [c for c in trainer.callbacks if c is not callback]  # type: ignore[attr-defined]


def restart_train_iterator(trainer: pl.Trainer) -> None:
    """Create the training iterator again, as ``FitLoop.setup_data`` did before ``on_train_start``.

    Lightning 2.6 creates the iterator before any hook that can change the loader's sampler; an
    exact mid-epoch resume of a plain ``DataLoader`` has to make it again after changing it.
    """
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None:
        raise RuntimeError("Lightning has no training data fetcher yet: call this from on_train_start.")
    iter(fetcher)


def set_epoch_position(trainer: pl.Trainer, batches: int) -> None:
    """Make the restored training epoch count ``batches`` of its batches as done (issue 25).

    After a restart on another number of ranks the epoch goes on as an uninterrupted run on the new
    ranks would, from the same point of its data: the loop's progress (restored from the checkpoint,
    in batches of the old number of ranks) is moved by the same amount in every counter, so the
    relations Lightning reads its restart stage from hold. Call from ``on_train_start``.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress
    trackers: list[Any] = [progress.current, progress.total]  # _ProcessedTracker at runtime
    delta = batches - trackers[0].processed
    for tracker in trackers:
        tracker.ready += delta
        tracker.started += delta
        tracker.processed += delta
        tracker.completed += delta


class _TrainLoaderHook:
    """Stands in for ``strategy.process_dataloader`` (an instance attribute) during ``fit``."""

    def __init__(self, trainer: pl.Trainer, hook: Callable[[Any], object]) -> None:
        self.trainer, self.hook = trainer, hook
        self.strategy = trainer.strategy
        self.original = trainer.strategy.process_dataloader

    def __call__(self, dataloader: Any) -> Any:
        dataloader = self.original(dataloader)
        if self.trainer.training and not self.trainer.sanity_checking:
            self.hook(dataloader)
        return dataloader

    def remove(self) -> None:
        if self.strategy.__dict__.get("process_dataloader") is self:
            del self.strategy.process_dataloader


def watch_train_loaders(trainer: pl.Trainer, hook: Callable[[Any], object]) -> Callable[[], None]:
    """Call ``hook`` on every training loader as Lightning prepares it, before its first iterator.

    ``FitLoop.setup_data`` requests the training loaders (from the user's hooks, maybe re-made with a
    distributed sampler), hands each to the public ``Strategy.process_dataloader`` and then creates
    the first iterator, before any callback hook runs. For the duration of ``fit`` an instance
    attribute stands in for that method. Returns the function that removes it.
    """
    watcher = _TrainLoaderHook(trainer, hook)
    trainer.strategy.process_dataloader = watcher  # type: ignore[method-assign]
    return watcher.remove


# Where Lightning keeps the training loaders' states in a checkpoint: ``_FitLoop.on_save_checkpoint``
# stores ``CombinedLoader._state_dicts()`` (one entry per stateful loader, of the saving rank only)
# and ``_FitLoop.on_load_checkpoint`` takes them from the same place, to load them into the loaders
# in ``FitLoop.setup_data`` (only when restarting mid-epoch), before any callback hook runs.
_LOADER_STATES = ("loops", "fit_loop", "state_dict", "combined_loader")
# The fit loop's validation progress in a checkpoint.
_VAL_PROGRESS = ("loops", "fit_loop", "epoch_loop.val_loop.batch_progress")


def _walk(checkpoint: dict[str, Any], keys: tuple[str, ...]) -> Any:
    node: Any = checkpoint
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def train_loader_states(checkpoint: dict[str, Any]) -> list[Any] | None:
    """The training loaders' states Lightning put in ``checkpoint`` (``None`` if there are none)."""
    states = _walk(checkpoint, _LOADER_STATES)
    return states if isinstance(states, list) else None


def replace_train_loader_states(checkpoint: dict[str, Any], states: list[Any]) -> bool:
    """Make Lightning load ``states`` into the training loaders; call from ``Callback.on_load_checkpoint``.

    Lightning reads the loop state from the same dict after the callbacks' ``on_load_checkpoint``
    (``_CheckpointConnector.restore_training_state`` -> ``restore_loops``). Returns whether it was there.
    """
    parent = _walk(checkpoint, _LOADER_STATES[:-1])
    if not isinstance(parent, dict) or _LOADER_STATES[-1] not in parent:
        return False
    parent[_LOADER_STATES[-1]] = states
    return True


def wrapped_sampler(sampler: Any) -> Any:
    """The user's sampler inside Lightning's ``DistributedSamplerWrapper`` (``None`` for other samplers)."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    if not isinstance(sampler, DistributedSamplerWrapper):
        return None
    return getattr(sampler.dataset, "_sampler", None)


def redo_validation_on_restart(checkpoint: dict[str, Any]) -> bool:
    """Make a checkpoint taken during fit's validation restart that validation from its first batch.

    Lightning restarts a validation only when the saved progress says "inside a validation step"
    (``_EvaluationLoop.update_restart_stage``: started == ready, processed == started - 1); from a
    save in a validation hook it would skip the rest of that validation instead. The progress is
    rewritten to "inside the first batch of this validation". Returns whether it was there.
    """
    node = _walk(checkpoint, _VAL_PROGRESS)
    if not isinstance(node, dict):
        return False
    before = max(int(node["total"]["completed"]) - int(node["current"]["completed"]), 0)
    node["total"] = {"ready": before + 1, "started": before + 1, "processed": before, "completed": before}
    node["current"] = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    node["is_last_batch"] = False
    return True


def settle_validation_progress(trainer: pl.Trainer) -> None:
    """After a restarted validation: drop the one batch that was counted as started but never ran.

    Without this, every later checkpoint looks like "inside a validation step" to Lightning.
    """
    total: Any = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total  # a _BatchProgress tracker
    total.ready = total.started = total.processed = total.completed


def stop_deferred(trainer: pl.Trainer) -> bool:
    """Whether a stop was asked for (``trainer.should_stop``) that Lightning puts off until
    ``min_steps``/``min_epochs`` are met: training goes on, and the request is in no checkpoint."""
    return bool(trainer.should_stop) and not trainer.fit_loop._can_stop_early


# -- epoch boundaries ---------------------------------------------------------------------------------

# The fit loop's epoch progress in a checkpoint.
_EPOCH_PROGRESS = ("loops", "fit_loop", "epoch_progress")


def between_epochs(trainer: pl.Trainer) -> bool:
    """Whether no epoch is under way: every epoch started has been processed and completed.

    True at the next epoch's ``on_train_epoch_start`` (only ``ready`` has moved on), at
    ``on_train_end``, and when Lightning stops on SIGTERM after an epoch end; False inside an epoch,
    its validation and its ``on_train_epoch_end`` hooks.
    """
    total: Any = trainer.fit_loop.epoch_progress.total  # a _ProcessedTracker (typed as its base)
    return bool(total.started == total.processed == total.completed)


def mark_between_epochs(checkpoint: dict[str, Any]) -> bool:
    """Make a checkpoint taken between two epochs read as "the last epoch completed, none begun".

    At the next epoch's ``on_train_epoch_start`` Lightning has counted that epoch as ready; restored
    as such, its restart logic takes it for an epoch interrupted at its start. Returns whether the
    progress was there.
    """
    node = _walk(checkpoint, _EPOCH_PROGRESS)
    if not isinstance(node, dict):
        return False
    for tracker in node.values():
        tracker["ready"] = tracker["started"]
    return True


def start_epoch_afresh(trainer: pl.Trainer) -> None:
    """Run the epoch that starts now as an uninterrupted run does; call at its ``on_train_epoch_start``.

    After a restore from a checkpoint taken between epochs, Lightning 2.6 keeps its loops
    "restarting" when training is bounded by ``max_steps`` (``_FitLoop.restarting`` is forced for
    iteration-based training): the epoch loop then re-runs the previous epoch's end (its
    ``on_train_epoch_end`` hooks, without the metrics they read) and counts a phantom batch. And,
    as the fit resumes, it keeps the iterator made in ``FitLoop.setup_data`` before
    ``on_train_start`` instead of making the epoch's iterator where an uninterrupted run does.
    """
    from lightning.pytorch.loops.loop import _Loop

    fit_loop = trainer.fit_loop
    # The base setter, not _FitLoop's (which keeps True for max_steps); it reaches every child loop.
    _Loop.restarting.fset(fit_loop, False)  # type: ignore[attr-defined]
    fit_loop.reset_restart_stage()
    fit_loop.epoch_loop.reset_restart_stage()
    fit_loop.epoch_loop.val_loop.reset_restart_stage()
    fit_loop._resuming_from_checkpoint = False  # the epoch loop makes the epoch's iterator


def settle_fit_restart(trainer: pl.Trainer) -> None:
    """After a mid-epoch restore has been applied: let the resumed epoch end as an uninterrupted one.

    While the fit loop is "restarting" (until its first epoch ends) Lightning skips the
    ``ReduceLROnPlateau`` step at the epoch end, because the metrics it reads were not restored; they
    are (:func:`put_back_callback_metrics`). Only the fit loop's own flag changes: the epoch loop
    keeps its restart state.
    """
    trainer.fit_loop._restarting = False


# -- what the callbacks read, and the epoch's logged accumulators --------------------------------------


def callback_metrics(trainer: pl.Trainer) -> dict[str, torch.Tensor]:
    """The metrics callbacks read (``trainer.callback_metrics``) as stored, without merging the
    results of the loop under way (reading the public property does that)."""
    return dict(trainer._logger_connector._callback_metrics)


def put_back_callback_metrics(trainer: pl.Trainer, metrics: dict[str, torch.Tensor]) -> None:
    """Give ``trainer.callback_metrics`` back what :func:`callback_metrics` returned (from
    ``on_train_start`` on: the sanity check clears them before it)."""
    stored = trainer._logger_connector._callback_metrics
    stored.clear()
    stored.update(metrics)


# ``self.log(reduce_fx=...)`` as Lightning stores it, by a name a checkpoint can hold.
_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "mean": torch.mean,
    "sum": torch.sum,
    "max": torch.max,
    "min": torch.min,
    "builtin sum": sum,
    "builtin max": max,
    "builtin min": min,
}
_METADATA = ("fx", "name", "prog_bar", "logger", "on_step", "on_epoch", "enable_graph")
_METADATA_OPTIONAL = ("add_dataloader_idx", "dataloader_idx", "metric_attribute")


def _reduction_name(reduce_fx: Any) -> str | None:
    return next((name for name, fx in _REDUCTIONS.items() if fx is reduce_fx), None)


def epoch_accumulators(trainer: pl.Trainer) -> list[dict[str, Any]]:
    """What the training epoch's ``self.log(..., on_epoch=True)`` calls accumulated so far.

    Lightning keeps them in the epoch loop's ``_ResultCollection`` (no ``state_dict`` in 2.6): per
    key, the metadata of the ``log`` call and the running value (and batch count, for a mean), or,
    for a logged ``torchmetrics.Metric``, the module attribute that holds it. Entries Lightning could
    not rebuild the same way (a ``sync_dist_group``) are left out.
    """
    found = []
    for key, result in trainer.fit_loop.epoch_loop._results.items():
        meta = result.meta
        reduction = _reduction_name(meta.reduce_fx)
        if result.has_reset or not meta.on_epoch or reduction is None or meta.sync.group is not None:
            continue
        if not result.is_tensor and meta.metric_attribute is None:
            continue
        entry: dict[str, Any] = {name: getattr(meta, name) for name in _METADATA + _METADATA_OPTIONAL}
        entry.update(
            key=key,
            reduce=reduction,
            sync=bool(meta.sync.should),
            rank_zero_only=bool(meta.sync.rank_zero_only),
            is_tensor=bool(result.is_tensor),
            update_count=int(result._update_count),
        )
        if result.is_tensor:
            entry["state"] = {k: v.detach().cpu().clone() for k, v in result.metric_state.items()}
        found.append(entry)
    return found


def put_back_epoch_accumulators(trainer: pl.Trainer, entries: list[dict[str, Any]]) -> None:
    """Register what :func:`epoch_accumulators` returned in this epoch's results, before any batch.

    The resumed ``self.log`` calls find their key with equal metadata and add to it; keys the
    resumed part of the epoch never logs again are still logged at the epoch end, as they were.
    Call from ``on_train_start`` of a resume inside an epoch.
    """
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric, _Sync

    # ``LightningModule.log`` drops the accumulated tensors at a loop's first batch
    # (``_LoggerConnector.should_reset_tensors``: ``_first_loop_iter`` None or True); the resumed first
    # batch is not the epoch's first: as if one batch had run, ``on_batch_start`` makes it False.
    trainer._logger_connector._first_loop_iter = True
    results = trainer.fit_loop.epoch_loop._results
    modules = dict(trainer.lightning_module.named_modules())
    for entry in entries:
        meta = _Metadata(
            **{name: entry[name] for name in _METADATA + _METADATA_OPTIONAL},
            reduce_fx=_REDUCTIONS[entry["reduce"]],
        )
        meta.sync = _Sync(
            fn=trainer.strategy.reduce, _should=entry["sync"], rank_zero_only=entry["rank_zero_only"]
        )
        result = _ResultMetric(meta, entry["is_tensor"])
        if entry["is_tensor"]:
            for name, value in entry["state"].items():
                setattr(result, name, value.to(trainer.strategy.root_device))
        else:
            metric = modules.get(entry["metric_attribute"])
            if metric is None:
                continue
            result.value = metric
        result._update_count = entry["update_count"]
        result.has_reset = False
        results[entry["key"]] = result


def logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning passes to ``Logger.log_metrics`` next (``_LoggerConnector.log_metrics``).

    From the first ``on_train_batch_start`` of a resumed attempt on, it is the step that batch is
    logged at (during ``on_train_start`` it is still one lower: the loop adds one when it starts). It
    differs from ``global_step`` under manual optimization with several optimizers.
    """
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def point_logger_at_version(logger: Logger, version: int | str) -> None:
    """Make a ``TensorBoardLogger`` or ``CSVLogger`` log into ``version`` from now on.

    Both decide their version once (``_version``) and create their writer once (``_experiment``), with
    no public way to change either afterwards. The caller closes the old writer first (rank 0).
    """
    if not isinstance(logger, (TensorBoardLogger, CSVLogger)):
        raise TypeError(f"expected a TensorBoardLogger or CSVLogger, got {type(logger).__name__}")
    logger._version = version
    logger._experiment = None


@dataclass(frozen=True)
class MLflowTarget:
    """Where an ``MLFlowLogger`` logs, as configured (nothing is created to find out)."""

    tracking_uri: str
    experiment_name: str
    run_id: str | None
    started: bool


def mlflow_target(logger: MLFlowLogger) -> MLflowTarget:
    """The tracking store, experiment name and run id an ``MLFlowLogger`` was given, and whether it started.

    The logger has public properties for its run and experiment ids, but reading them creates the run.
    """
    return MLflowTarget(logger._tracking_uri, logger._experiment_name, logger._run_id, logger._initialized)


def set_mlflow_run(logger: MLFlowLogger, run_id: str | None) -> None:
    """Have an ``MLFlowLogger`` that has not started continue ``run_id`` (``None``: a new run).

    With a run id, Lightning's logger continues that run instead of creating one, as with its
    ``run_id`` argument, which the user would have to read from the run dir before building the logger.
    """
    logger._run_id = run_id
    logger._experiment_id = None
    logger._initialized = False


def saves_directory(strategy: Strategy) -> bool | None:
    """Whether ``trainer.save_checkpoint`` writes a directory with ``strategy`` (``None``: unknown).

    Sharded saves bypass ``CheckpointIO``. Lightning keeps the choice in constructor arguments it
    stores as-is: ``ModelParallelStrategy(save_distributed_checkpoint=True)`` (the default) and
    ``FSDPStrategy(state_dict_type="sharded")`` (not the default, ``"full"``). DeepSpeed always writes
    a directory. A strategy that does not override ``Strategy.save_checkpoint`` writes one file.
    """
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, ModelParallelStrategy):
        return bool(strategy._save_distributed_checkpoint)
    if isinstance(strategy, FSDPStrategy):
        return bool(strategy._state_dict_type == "sharded")
    if type(strategy).__name__ == "DeepSpeedStrategy":  # importing it needs deepspeed installed
        return True
    if type(strategy).save_checkpoint is Strategy.save_checkpoint:
        return False
    return None


def capture_checkpoint(trainer: pl.Trainer, path: Path) -> dict[str, Any]:
    """Lightning's checkpoint for a save to ``path`` on this rank, built but not written (every rank).

    ``Trainer.save_checkpoint`` dumps the checkpoint (callback and module hooks included), hands it
    to ``strategy.save_checkpoint`` and ends with a barrier. For the duration of the call an
    instance attribute stands in for that public method and keeps the checkpoint instead, so an
    asynchronous writer can write it later.
    """
    strategy = trainer.strategy
    captured: dict[str, dict[str, Any]] = {}

    def keep(checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        captured["checkpoint"] = checkpoint

    strategy.save_checkpoint = keep  # type: ignore[method-assign]
    try:
        trainer.save_checkpoint(path, weights_only=False)
    finally:
        del strategy.save_checkpoint
    return captured["checkpoint"]


def report_checkpoint_path(trainer: pl.Trainer, path: str) -> None:
    """Make Lightning name ``path`` as the checkpoint it restored (and ``trainer.ckpt_path`` return it).

    Call from inside ``strategy.load_checkpoint``: ``_CheckpointConnector.resume_start`` records the
    requested path just before that call, and ``resume_end`` logs "Restored all states from the
    checkpoint at <path>" with the recorded one.
    """
    trainer._checkpoint_connector._ckpt_path = path


# -- Lightning's warnings, matched by their texts ------------------------------------------------------

#: What to silence: a pattern of the module that warns ("": any) and patterns of its messages.
Quieted = tuple[str, tuple[str, ...]]
_LIGHTNING = r"(lightning\.pytorch|pytorch_lightning)"  # the unified and the standalone package
#: Lightning's checkpoint connector, on a fresh run with nothing to resume.
NOTHING_TO_RESUME: Quieted = (
    rf"{_LIGHTNING}\.trainer\.connectors\.checkpoint_connector",
    (
        r"`\.fit\(ckpt_path=None\)` was called without a model",
        r"\.fit\(ckpt_path=\"last\"\) is set, but there is no last checkpoint available",
    ),
)
#: Lightning's training epoch loop, on a mid-epoch restart with a loader without ``state_dict``.
NOT_RESUMABLE: Quieted = (
    rf"{_LIGHTNING}\.loops\.training_epoch_loop",
    (
        r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"
        r" not resumable",
    ),
)


def _remove(filters: list[Any]) -> None:
    # Removing an "ignore" filter needs no cache reset: ignored warnings are not recorded as seen.
    installed: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
    for item in filters:
        with contextlib.suppress(ValueError):
            installed.remove(item)


class QuietLightning:
    """Install the filters now; they go when ``owner`` is garbage-collected or :meth:`remove` is called.

    Args:
        owner: The object whose lifetime bounds the filters.
        which: What to silence (:data:`NOTHING_TO_RESUME`, :data:`NOT_RESUMABLE`, ...).
    """

    def __init__(self, owner: object, which: Quieted = NOTHING_TO_RESUME) -> None:
        module, messages = which
        before = list(warnings.filters)
        for message in messages:
            warnings.filterwarnings("ignore", message=message, module=module)
        added = [item for item in warnings.filters if item not in before]
        self._finalizer = weakref.finalize(owner, _remove, added)

    def remove(self) -> None:
        """Remove the filters now."""
        self._finalizer()


def log_dir_exists(log_dir: Path) -> Quieted:
    """A logger's "Experiment logs directory ... exists" for ``log_dir``, whose rows are kept."""
    # The message names the dir as the logger was configured (maybe relative): match its last parts.
    tail = re.escape(os.sep.join(log_dir.parts[-2:]))
    return "", (rf"Experiment logs directory (.*{re.escape(os.sep)})?{tail} exists",)


@contextlib.contextmanager
def any_log_dir_exists() -> Iterator[None]:
    """Silence every "Experiment logs directory ... exists" inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        yield


# -- a logger started on first use --------------------------------------------------------------------------


class CometLoggerStartedOnFirstUse(CometLogger):
    """Lightning's ``CometLogger``, its experiment started at the first ``experiment`` instead of in its
    constructor; a subclass may wrap the start (:meth:`start_experiment`).

    Lightning's constructor ends with ``self._create_experiment()`` (on rank 0); ``experiment`` calls
    it again when no experiment exists. The first call is skipped, so the first use starts it.
    """

    _start_on_first_use = False

    def _create_experiment(self) -> None:
        if not self._start_on_first_use:
            self._start_on_first_use = True
            return
        self.start_experiment(super()._create_experiment)

    def start_experiment(self, start: Callable[[], None]) -> None:
        """Start the experiment (``start()``); override to do something around it."""
        start()
