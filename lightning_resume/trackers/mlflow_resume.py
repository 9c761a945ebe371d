"""``MLflowResume``: a restarted job continues its MLflow run."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from typing_extensions import override

from lightning_resume._compat.lightning import mlflow_target
from lightning_resume.trackers.loggers.mlflow_logger import PLACE_FIELDS, TRACKER, MLFlowLogger, normalize_uri
from lightning_resume.trackers.tracker_resume import Handback, TrackerResume


class MLflowResume(TrackerResume):
    """Make a restarted job continue the MLflow run of its first attempt, with no throwaway run.

    Records ``id``, ``experiment_id``, ``experiment_name``, ``tracking_uri`` and ``run_name`` of the
    logger's run in ``<run dir>/mlflow_resume.json`` and in every checkpoint. Lightning's
    ``MLFlowLogger`` reads no run id from the environment, so
    :class:`lightning_resume.loggers.MLFlowLogger` continues the recorded run itself (see there); with
    Lightning's own, a restart creates a new run, and this callback says so.

    Raises:
        ModuleNotFoundError: when mlflow is not installed.
        ValueError: at ``setup`` when the Trainer logs to several MLflow runs.

    Example::

        from lightning_resume.loggers import MLFlowLogger

        callbacks = [MLflowResume(), RunDir(root="runs"), RequeueCheckpoint()]
        logger = MLFlowLogger(experiment_name="mnist", tracking_uri="sqlite:///mlflow.db")
        trainer = Trainer(logger=logger, callbacks=callbacks)
    """

    tracker = TRACKER
    package = "mlflow"
    logger_class = LightningMLFlowLogger
    place_fields = PLACE_FIELDS
    handback_caveat = (
        "; or the logger is Lightning's MLFlowLogger, which cannot be told to continue a run: use "
        "lightning_resume.loggers.MLFlowLogger"
    )

    @override
    def _identity_of(self, logger: LightningMLFlowLogger) -> dict[str, Any]:
        client = logger.experiment
        run = client.get_run(logger.run_id)
        identity = {
            "id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "experiment_name": client.get_experiment(run.info.experiment_id).name,
            "tracking_uri": normalize_uri(mlflow_target(logger).tracking_uri),
            "run_name": run.info.run_name,
        }
        # No hand-back: our MLFlowLogger continues a recorded run itself; Lightning's starts a new one.
        if self._outcome is Handback.DELEGATED and not isinstance(logger, MLFlowLogger):
            self._check_continued(identity)
        return identity
