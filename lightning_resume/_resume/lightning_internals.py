"""The one place that touches Lightning internals, for what Lightning offers no public route.

Pinned by ``tests/resume/test_lightning_internals.py``: when Lightning changes, that test fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.strategies import Strategy


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
