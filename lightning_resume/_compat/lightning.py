"""Every touch of Lightning's internals (where it offers no public route), one named function each,
pinned by ``tests/_compat/test_lightning.py``; ``tests/_compat/test_seam.py`` keeps them all here."""

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
    """A callback ``fit(ckpt_path=None)`` resumes from: an ``OnExceptionCheckpoint`` makes it ``"last"``,
    which considers its ``ckpt_path``; as a ``Checkpoint`` it keeps the default ``ModelCheckpoint`` out."""

    def __init__(self) -> None:
        super().__init__(dirpath=".", filename="last")  # Lightning's dirpath and filename stay unused
        allow_without_checkpointing()

    @property
    def ckpt_path(self) -> str:
        raise NotImplementedError


def allow_without_checkpointing() -> None:
    """Let ``Trainer(enable_checkpointing=False)`` take :class:`LastCheckpointCallback`s, which
    ``_configure_checkpoint_callbacks`` refuses as any ``Checkpoint`` (patched once per process)."""
    from lightning.pytorch.trainer.connectors.callback_connector import _CallbackConnector

    original = _CallbackConnector._configure_checkpoint_callbacks
    if getattr(original, "_resume_only", False):
        return

    def configure(self: Any, enable_checkpointing: bool) -> None:
        checkpoints = self.trainer.checkpoint_callbacks
        if enable_checkpointing or not all(isinstance(c, LastCheckpointCallback) for c in checkpoints):
            original(self, enable_checkpointing)

    configure._resume_only = True  # type: ignore[attr-defined]
    _CallbackConnector._configure_checkpoint_callbacks = configure  # type: ignore[method-assign]


# -- methods of Lightning's objects, stood in for ---------------------------------------------------------


def _stand_in(owner: Any, name: str, stand_in: Callable[..., Any]) -> Callable[[], None]:
    """Set ``owner.<name>`` to ``stand_in`` (an instance attribute); returns what takes it away again."""
    setattr(owner, name, stand_in)

    def undo() -> None:
        if owner.__dict__.get(name) is stand_in:
            delattr(owner, name)

    return undo


LoadHandler = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


class NextLoad:
    """Stands in for ``strategy.load_checkpoint`` once: ``handler(original, path, args, kwargs)`` runs."""

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


def put_callback(
    trainer: pl.Trainer, callback: Callback, before: Callback | None = None, after: Callback | None = None
) -> None:
    """Put ``callback`` before ``before``, after ``after``, or first (a new list: Lightning may iterate)."""
    callbacks = [c for c in trainer.callbacks if c is not callback]  # type: ignore[attr-defined]
    at = callbacks.index(before) if before is not None and before in callbacks else 0
    if after is not None and after in callbacks:
        at = callbacks.index(after) + 1
    trainer.callbacks = [*callbacks[:at], callback, *callbacks[at:]]  # type: ignore[attr-defined]


def take_callback(trainer: pl.Trainer, callback: Callback) -> None:
    trainer.callbacks = [c for c in trainer.callbacks if c is not callback]  # type: ignore[attr-defined]


def restart_train_iterator(trainer: pl.Trainer) -> None:
    """Create the training iterator again (Lightning makes it before any hook can change the sampler)."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None:
        raise RuntimeError("Lightning has no training data fetcher yet: call this from on_train_start.")
    iter(fetcher)


def set_epoch_position(trainer: pl.Trainer, batches: int) -> None:
    """Count ``batches`` of the restored epoch as done, every counter alike (issue 25; ``on_train_start``)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    trackers: list[Any] = [progress.current, progress.total]  # _ProcessedTracker at runtime
    delta = batches - trackers[0].processed
    for tracker in trackers:
        tracker.ready += delta
        tracker.started += delta
        tracker.processed += delta
        tracker.completed += delta


def watch_train_loaders(trainer: pl.Trainer, hook: Callable[[Any], object]) -> Callable[[], None]:
    """Call ``hook`` on each fit loader ``process_dataloader`` prepares, before any iterator; returns undo."""
    original = trainer.strategy.process_dataloader

    def process_dataloader(dataloader: Any) -> Any:
        dataloader = original(dataloader)
        if trainer.training and not trainer.sanity_checking:
            hook(dataloader)
        return dataloader

    return _stand_in(trainer.strategy, "process_dataloader", process_dataloader)


# The training loaders' states (``CombinedLoader._state_dicts()``, saving rank only), loaded in
# ``FitLoop.setup_data`` on a mid-epoch restart before any callback hook.
_LOADER_STATES = ("loops", "fit_loop", "state_dict", "combined_loader")


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
    """Have Lightning load ``states`` into the train loaders (``on_load_checkpoint``); False: no entry."""
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
    """Make a checkpoint taken inside fit's validation redo all of it; False: no progress there."""
    node = _walk(checkpoint, ("loops", "fit_loop", "epoch_loop.val_loop.batch_progress"))
    if not isinstance(node, dict):
        return False
    before = max(int(node["total"]["completed"]) - int(node["current"]["completed"]), 0)
    node["total"] = {"ready": before + 1, "started": before + 1, "processed": before, "completed": before}
    node["current"] = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    node["is_last_batch"] = False
    return True


def settle_validation_progress(trainer: pl.Trainer) -> None:
    """Drop the batch a restarted validation counted as started (else later saves look mid-step)."""
    total: Any = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total  # a _BatchProgress tracker
    total.ready = total.started = total.processed = total.completed


def restart_swa_epochs(trainer: pl.Trainer) -> list[str]:
    """Run the ``on_train_epoch_start`` a mid-epoch restart skips, for each ``StochasticWeightAveraging``."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    # It makes the SWALR scheduler again, which on_fit_start removed; the restored latest_update_epoch
    # skips the averaging it would also do.
    epoch, done = trainer.current_epoch, []
    for c in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(c, StochasticWeightAveraging) and c.swa_start <= epoch <= c.swa_end:
            c.on_train_epoch_start(trainer, trainer.lightning_module)
            done.append(type(c).__name__)
    return done


def skips_backward(trainer: pl.Trainer) -> bool:
    """Whether this epoch's steps run no backward (``StochasticWeightAveraging``'s BatchNorm epoch)."""
    return bool(trainer.fit_loop._skip_backward)


def rebuilds_ddp_buckets(strategy: Strategy) -> bool:
    """Whether DDP re-lays its gradient buckets after a first backward (a restart's first step differs)."""
    from lightning.pytorch.strategies import DDPStrategy

    if not isinstance(strategy, DDPStrategy):
        return False
    options = strategy._ddp_kwargs
    return bool(options.get("static_graph")) or not options.get("find_unused_parameters")


def next_step_uses_held_grads(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether step ``batch_idx`` adds to the held gradients (accumulating, or SWA's BatchNorm epoch)."""
    module = trainer.lightning_module
    if not module.automatic_optimization:
        return False  # the user's own zero_grad: unknown
    return skips_backward(trainer) or batch_idx % trainer.accumulate_grad_batches != 0


def validation_log_steps(trainer: pl.Trainer) -> dict[int, int]:
    """The step each validation loader logs ``on_step`` values at next (counted over the whole ``fit``)."""
    return dict(trainer.fit_loop.epoch_loop.val_loop._seen_batches_per_dataloader)


def put_back_validation_log_steps(trainer: pl.Trainer, steps: dict[int, int]) -> None:
    """Continue the counts :func:`validation_log_steps` returned (after the loaders were made)."""
    seen = trainer.fit_loop.epoch_loop.val_loop._seen_batches_per_dataloader
    seen.clear()
    seen.update({int(k): int(v) for k, v in steps.items()})


def train_loader_mode(trainer: pl.Trainer) -> str:
    """How Lightning combines several training loaders (``CombinedLoader``'s mode)."""
    combined = trainer.fit_loop._combined_loader
    return str(combined._mode) if combined is not None else "max_size_cycle"


def stop_deferred(trainer: pl.Trainer) -> bool:
    """Whether Lightning puts a stop off until ``min_steps``/``min_epochs`` (no checkpoint holds it)."""
    return bool(trainer.should_stop) and not trainer.fit_loop._can_stop_early


# -- epoch boundaries ---------------------------------------------------------------------------------


def between_epochs(trainer: pl.Trainer) -> bool:
    """Whether no epoch is under way (True in ``on_train_epoch_start``, False in ``on_train_epoch_end``)."""
    total: Any = trainer.fit_loop.epoch_progress.total  # a _ProcessedTracker (typed as its base)
    return bool(total.started == total.processed == total.completed)


def mark_between_epochs(checkpoint: dict[str, Any]) -> bool:
    """Make a checkpoint taken between epochs read as "last one completed, next one ready"; False: none."""
    node = _walk(checkpoint, ("loops", "fit_loop", "epoch_progress"))
    if not isinstance(node, dict):
        return False
    for tracker in node.values():
        tracker["ready"] = tracker["started"]
    return True


def start_epoch_afresh(trainer: pl.Trainer) -> None:
    """Run this epoch as an uninterrupted run does: restored between epochs under ``max_steps``, Lightning 2.6
    stays "restarting", reruns the last epoch's end, counts a phantom batch and keeps the old iterator."""
    from lightning.pytorch.loops.loop import _Loop

    fit_loop = trainer.fit_loop
    # The base setter, not _FitLoop's (which keeps True for max_steps); it reaches every child loop.
    _Loop.restarting.fset(fit_loop, False)  # type: ignore[attr-defined]
    fit_loop.reset_restart_stage()
    fit_loop.epoch_loop.reset_restart_stage()
    fit_loop.epoch_loop.val_loop.reset_restart_stage()
    fit_loop._resuming_from_checkpoint = False  # the epoch loop makes the epoch's iterator


def settle_fit_restart(trainer: pl.Trainer) -> None:
    """After a mid-epoch restore: stop "restarting", in which Lightning skips ``ReduceLROnPlateau``'s step."""
    trainer.fit_loop._restarting = False


#: A callback class's hook set to this is skipped (``_call_callback_hooks`` calls only a ``callable`` hook):
#: an unused per-step hook then costs a lookup, not a call inside a profiler context.
NOT_CALLED = None


# The temporary checkpoints LearningRateFinder and BatchSizeFinder save before their search and restore
# after it (``tuner/lr_finder.py::_lr_find``, ``tuner/batch_size_scaling.py::_scale_batch_size``).
_TUNER_CHECKPOINT = re.compile(r"^\.(lr_find|scale_batch_size)_[0-9a-f-]+\.ckpt$")


def restoring_tuner_checkpoint(trainer: pl.Trainer) -> bool:
    """Whether the checkpoint being loaded is a tuner's temporary one (its restore reruns every load hook)."""
    path = trainer._checkpoint_connector._ckpt_path
    return path is not None and bool(_TUNER_CHECKPOINT.match(os.path.basename(str(path))))


def tuners(trainer: pl.Trainer) -> list[Callback]:
    """The ``LearningRateFinder`` and ``BatchSizeFinder`` callbacks, in the Trainer's order."""
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return [c for c in callbacks if isinstance(c, (LearningRateFinder, BatchSizeFinder))]


def tuner_result(callback: Callback, module: pl.LightningModule) -> dict[str, Any]:
    """What a tuner's search left: the attribute it set (if any), its value now, and its own result."""
    from lightning.pytorch.callbacks import BatchSizeFinder
    from lightning.pytorch.tuner.lr_finder import _determine_lr_attr_name
    from lightning.pytorch.utilities.parsing import lightning_getattr

    attribute: str | None = None
    if isinstance(callback, BatchSizeFinder):
        attribute = str(callback._batch_arg_name)
        optimal = getattr(callback, "optimal_batch_size", None)
    else:
        if callback._update_attr:  # type: ignore[attr-defined]
            attribute = _determine_lr_attr_name(module, callback._attr_name)  # type: ignore[attr-defined]
        finder = getattr(callback, "optimal_lr", None)  # Lightning 2.5.0 sets it once the search ends
        optimal = None if finder is None else {"results": finder.results, **_lr_finder_args(finder)}
    found: dict[str, Any] = {"attribute": attribute}
    if attribute is not None:
        found["value"] = lightning_getattr(module, attribute)
    found["optimal"] = optimal
    return found


def _lr_finder_args(finder: Any) -> dict[str, Any]:
    return {"mode": finder.mode, "lr_min": finder.lr_min, "lr_max": finder.lr_max, "num": finder.num_training}


def put_back_tuner_result(callback: Callback, module: pl.LightningModule, result: dict[str, Any]) -> None:
    """Set what :func:`tuner_result` returned, as the search did (learning rates come with the optimizers)."""
    from lightning.pytorch.callbacks import BatchSizeFinder
    from lightning.pytorch.tuner.lr_finder import _LRFinder
    from lightning.pytorch.utilities.parsing import lightning_setattr

    if result.get("attribute") is not None:
        lightning_setattr(module, result["attribute"], result["value"])
    optimal = result.get("optimal")
    if isinstance(callback, BatchSizeFinder):
        callback.optimal_batch_size = optimal
    elif isinstance(optimal, dict):
        finder = _LRFinder(optimal["mode"], optimal["lr_min"], optimal["lr_max"], optimal["num"])
        finder.results = optimal["results"]
        callback.optimal_lr = finder  # type: ignore[attr-defined]


def instead_of_tuner_search(callback: Callback, instead: Callable[[], None]) -> Callable[[], None]:
    """Make a tuner's ``on_fit_start`` (its search) run ``instead``; returns what gives its own back."""

    def run_instead(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        instead()

    return _stand_in(callback, "on_fit_start", run_instead)


def forget_train_loader(trainer: pl.Trainer) -> None:
    """Drop the train loader made so far (a tuner changed it): ``fit`` makes it again, restored."""
    trainer.fit_loop._combined_loader = None


def load_pending_train_loader_states(trainer: pl.Trainer) -> bool:
    """Load the train loader states Lightning left unloaded; returns whether it did (remake the iterator)."""
    # Lightning's issue #21765: a ``configure_optimizers`` reading ``estimated_stepping_batches`` makes
    # the loader before the states are restored, and ``setup_data`` then keeps it as it is.
    fit_loop = trainer.fit_loop
    states, combined = fit_loop._combined_loader_states_to_load, fit_loop._combined_loader
    if not states or combined is None or not fit_loop.restarting:
        return False
    combined._load_state_dicts(states)
    fit_loop._combined_loader_states_to_load = []
    return True


def next_train_batch(trainer: pl.Trainer) -> Any:
    """The next training step's batch (``None``: none), fetched into Lightning's fetcher: for stops only."""
    from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher

    fetcher = trainer.fit_loop._data_fetcher
    if not isinstance(fetcher, _PrefetchDataFetcher) or fetcher.iterator is None:
        return None
    if not fetcher.batches:
        if fetcher.done:
            return None
        try:
            fetcher.batches.append(_DataFetcher.__next__(fetcher))
        except StopIteration:
            return None
    batch, _, _ = fetcher.batches[0]
    return batch


def transfer_hooks_overridden(trainer: pl.Trainer) -> bool:
    """Whether the module or datamodule changes batches on their way to the device."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    hooks = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
    owners = [trainer.lightning_module, getattr(trainer, "datamodule", None)]
    return any(o is not None and is_overridden(h, o) for o in owners for h in hooks)


def modes_before_validation(trainer: pl.Trainer) -> dict[str, bool]:
    """Inside fit's validation: each submodule's ``training`` flag as the validation began."""
    return dict(trainer.fit_loop.epoch_loop.val_loop._module_mode.mode)


# -- what the callbacks read, and the epoch's logged accumulators --------------------------------------


def callback_metrics(trainer: pl.Trainer) -> dict[str, torch.Tensor]:
    """``trainer.callback_metrics`` as stored (the property merges the running loop's results in)."""
    return dict(trainer._logger_connector._callback_metrics)


def put_back_callback_metrics(trainer: pl.Trainer, metrics: dict[str, torch.Tensor]) -> None:
    """Give back what :func:`callback_metrics` returned (``on_train_start``: the sanity check clears them)."""
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


def epoch_accumulators(trainer: pl.Trainer) -> list[dict[str, Any]]:
    """Per key, what the epoch's ``self.log(on_epoch=True)`` calls accumulated (metadata and value, or a
    ``Metric``'s attribute); not those with a ``sync_dist_group``, which cannot be rebuilt alike."""
    found = []
    for key, result in trainer.fit_loop.epoch_loop._results.items():
        meta = result.meta
        reduction = next((name for name, fx in _REDUCTIONS.items() if fx is meta.reduce_fx), None)
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
    """Register :func:`epoch_accumulators` in this epoch's results (``on_train_start`` of a resume)."""
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric, _Sync

    # ``should_reset_tensors`` drops the accumulated tensors at a loop's first batch (``_first_loop_iter``
    # None or True); as if one batch had run, ``on_batch_start`` makes it False.
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
    """The step Lightning passes to ``Logger.log_metrics`` next (one lower during ``on_train_start``)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def point_logger_at_version(logger: Logger, version: int | str) -> None:
    """Make a ``TensorBoardLogger`` or ``CSVLogger`` log into ``version`` (the caller closes its writer)."""
    if not isinstance(logger, (TensorBoardLogger, CSVLogger)):
        raise TypeError(f"expected a TensorBoardLogger or CSVLogger, got {type(logger).__name__}")
    logger._version = version
    logger._experiment = None


def continue_csv_rows(logger: CSVLogger, header: list[str]) -> None:
    """Make a ``CSVLogger``'s writer append to its ``metrics.csv``, rewritten with ``header``."""
    writer = logger.experiment
    writer.metrics_keys = list(header)
    writer.metrics = []


@dataclass(frozen=True)
class MLflowTarget:
    """Where an ``MLFlowLogger`` logs, as configured (nothing is created to find out)."""

    tracking_uri: str
    experiment_name: str
    run_id: str | None
    started: bool


def mlflow_target(logger: MLFlowLogger) -> MLflowTarget:
    """Where an ``MLFlowLogger`` logs (its public properties would create the run)."""
    return MLflowTarget(logger._tracking_uri, logger._experiment_name, logger._run_id, logger._initialized)


def set_mlflow_run(logger: MLFlowLogger, run_id: str | None) -> None:
    """Have an ``MLFlowLogger`` that has not started continue ``run_id`` (``None``: a new run)."""
    logger._run_id = run_id
    logger._experiment_id = None
    logger._initialized = False


def saves_directory(strategy: Strategy) -> bool | None:
    """Whether ``trainer.save_checkpoint`` writes a directory with ``strategy`` (``None``: unknown)."""
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
    """Lightning's checkpoint for a save to ``path``, built (hooks, barrier) but not written (every rank)."""
    captured: dict[str, dict[str, Any]] = {}

    def keep(checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        captured["checkpoint"] = checkpoint

    undo = _stand_in(trainer.strategy, "save_checkpoint", keep)
    try:
        trainer.save_checkpoint(path, weights_only=False)
    finally:
        undo()
    return captured["checkpoint"]


@contextlib.contextmanager
def seeing_checkpoints(trainer: pl.Trainer, seen: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """Hand each checkpoint Lightning builds in the block to ``seen``, after every hook, before any write."""
    original = trainer._checkpoint_connector.dump_checkpoint

    def dump(weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = original(weights_only)
        seen(checkpoint)
        return checkpoint

    undo = _stand_in(trainer._checkpoint_connector, "dump_checkpoint", dump)
    try:
        yield
    finally:
        undo()


def resume_even_if_none(trainer: pl.Trainer, path: str) -> Callable[[], None]:
    """Have ``fit`` restore ``path`` even if Lightning (choosing before hooks) found none; returns an undo."""
    original = trainer._checkpoint_connector.resume_start

    def resume_start(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> None:
        undo()
        original(checkpoint_path or path, *args, **kwargs)

    undo = _stand_in(trainer._checkpoint_connector, "resume_start", resume_start)
    return undo


def report_checkpoint_path(trainer: pl.Trainer, path: str) -> None:
    """Make Lightning report ``path`` as the checkpoint it restored (inside ``strategy.load_checkpoint``)."""
    trainer._checkpoint_connector._ckpt_path = path


# -- Lightning's warnings, matched by their texts ------------------------------------------------------

#: What to silence: a pattern of the module that warns ("": any) and patterns of its messages.
Quieted = tuple[str, tuple[str, ...]]
_LIGHTNING = r"(lightning\.pytorch|pytorch_lightning)"
#: ``validate``/``test``/``predict(ckpt_path=...)`` of a checkpoint with our private callbacks' states
#: (they join the Trainer for ``fit`` only, and hold nothing those need).
OWN_STATES_NOT_LOADED: Quieted = (
    "",
    (
        r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided"
        r" during `Trainer` instantiation. Please add the following callbacks:"
        r" \['(ExactResume|EpochBoundary)'(, '(ExactResume|EpochBoundary)')?\]",
    ),
)
#: ``ckpt_path="best"`` beside one ``ModelCheckpoint`` of the user's: ours is not a second one.
SEVERAL_MODEL_CHECKPOINTS: Quieted = (
    "",
    (
        r"`\.(validate|test|predict)\(ckpt_path=\"best\"\)` is called with Trainer configured with multiple"
        r" `ModelCheckpoint` callbacks",
    ),
)
#: A fresh run with nothing to resume.
NOTHING_TO_RESUME: Quieted = (
    rf"{_LIGHTNING}\.trainer\.connectors\.checkpoint_connector",
    (
        r"`\.fit\(ckpt_path=None\)` was called without a model",
        r"\.fit\(ckpt_path=\"last\"\) is set, but there is no last checkpoint available",
    ),
)
#: A mid-epoch restart with a loader without ``state_dict``.
NOT_RESUMABLE: Quieted = (
    rf"{_LIGHTNING}\.loops\.training_epoch_loop",
    (
        r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"
        r" not resumable",
    ),
)


def _remove(filters: list[Any]) -> None:
    # Removing an "ignore" filter needs no cache reset: ignored warnings are not recorded as seen.
    # By identity: another owner's equal filter (a second RequeueCheckpoint's) stays.
    installed: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
    for item in filters:
        at = next((i for i, f in enumerate(installed) if f is item), None)
        if at is not None:
            del installed[at]


class QuietLightning:
    """Filters for ``which``, until ``owner`` is garbage-collected or :meth:`remove` is called."""

    def __init__(self, owner: object, which: Quieted = NOTHING_TO_RESUME) -> None:
        module, messages = which
        before = {id(item) for item in warnings.filters}
        for message in messages:
            warnings.filterwarnings("ignore", message=message, module=module)
        # (an equal filter of another owner is replaced by this one's: it is new too)
        added = [item for item in warnings.filters if id(item) not in before]
        self._finalizer = weakref.finalize(owner, _remove, added)

    def remove(self) -> None:
        self._finalizer()


def log_dir_exists(log_dir: Path) -> Quieted:
    """A logger's "Experiment logs directory ... exists" for ``log_dir``, whose rows are kept."""
    # The message names the dir as the logger was configured (maybe relative): match its last parts.
    tail = re.escape(os.sep.join(log_dir.parts[-2:]))
    return "", (rf"Experiment logs directory (.*{re.escape(os.sep)})?{tail} exists",)


def checkpoint_dir_not_empty(path: Path) -> Quieted:
    """``ModelCheckpoint``'s "Checkpoint directory ... exists and is not empty" for ``path``, a run dir's."""
    names = dict.fromkeys((str(path), os.path.realpath(path)))
    return "", tuple(rf"Checkpoint directory {re.escape(name)} exists and is not empty" for name in names)


@contextlib.contextmanager
def any_log_dir_exists() -> Iterator[None]:
    """Silence every "Experiment logs directory ... exists" inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        yield


class CometLoggerStartedOnFirstUse(CometLogger):
    """Lightning's ``CometLogger``, started at the first ``experiment`` instead of in its constructor."""

    _start_on_first_use = False

    def _create_experiment(self) -> None:
        if not self._start_on_first_use:
            self._start_on_first_use = True
            return
        self.start_experiment(super()._create_experiment)

    def start_experiment(self, start: Callable[[], None]) -> None:
        """Start the experiment (``start()``); override to do something around it."""
        start()
