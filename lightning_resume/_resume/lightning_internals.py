"""The one place that touches Lightning internals, for what Lightning offers no public route.

Pinned by ``tests/resume/test_lightning_internals.py``: when Lightning changes, that test fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger


def restart_train_iterator(trainer: pl.Trainer) -> None:
    """Create the training iterator again, as ``FitLoop.setup_data`` did before ``on_train_start``.

    Lightning 2.6 creates the iterator before any hook that can change the loader's sampler; an
    exact mid-epoch resume of a plain ``DataLoader`` has to make it again after changing it.
    """
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None:
        raise RuntimeError("Lightning has no training data fetcher yet: call this from on_train_start.")
    iter(fetcher)


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
