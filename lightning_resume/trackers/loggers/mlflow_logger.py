"""``MLFlowLogger``: Lightning's MLflow logger, which continues its run after a restart."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import MLFlowLogger as _LightningMLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

from lightning_resume._compat.lightning import mlflow_target, set_mlflow_run
from lightning_resume._warnings import warn
from lightning_resume.trackers.sidecar import to_continue

log = logging.getLogger(__name__)

TRACKER = "mlflow"
#: Where an MLflow run lives (a run id means something only in one tracking store).
PLACE_FIELDS = ("tracking_uri", "experiment_name")


def normalize_uri(uri: str | None) -> str | None:
    """One spelling per local store (``file:/abs/path``, ``sqlite:////abs/path``); other URIs as they are."""
    if not uri:
        return uri
    if uri.startswith("sqlite:///"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).expanduser().resolve())
    parsed = urlparse(uri)
    if parsed.scheme in ("file", ""):
        return "file:" + str(Path(parsed.path if parsed.scheme else uri).expanduser().resolve())
    return uri


class MLFlowLogger(_LightningMLFlowLogger):
    """Lightning's ``MLFlowLogger``; after a restart it continues the MLflow run of the first attempt.

    Takes the arguments of :class:`lightning.pytorch.loggers.MLFlowLogger`. On a restart of a
    :class:`~lightning_resume.RunDir` whose :class:`~lightning_resume.MLflowResume` recorded a run, it
    continues that run (set back to ``RUNNING``) when its tracking store and experiment name are the
    recorded ones; otherwise it warns and creates a new run. An explicit ``run_id`` wins.

    MLflow cannot delete logged points: after a ``SIGKILL``, the steps between the last checkpoint and
    the kill appear twice in a metric's history; after a preemption signal, nothing does.

    Example::

        from lightning_resume.loggers import MLFlowLogger

        callbacks = [RunDir(root="runs"), RequeueCheckpoint(), MLflowResume()]
        logger = MLFlowLogger(experiment_name="mnist", tracking_uri="sqlite:///mlflow.db")
        trainer = Trainer(logger=logger, callbacks=callbacks)
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``MlflowClient``; on first use the run is created, or continued after a restart."""
        target = mlflow_target(self)
        if not target.started and target.run_id is None:
            run_id = self._recorded_run(target.tracking_uri, target.experiment_name)
            if run_id is not None:
                set_mlflow_run(self, run_id)
                client = super().experiment
                client.update_run(run_id, status="RUNNING")
                return client
        return super().experiment

    def _recorded_run(self, tracking_uri: str, experiment_name: str) -> str | None:
        """The run id recorded in the run dir to continue, or ``None`` for a new run."""

        def now() -> dict[str, Any]:  # asked at a restart only: a fresh run never parses the URI
            return {"tracking_uri": normalize_uri(tracking_uri), "experiment_name": experiment_name}

        found = to_continue(TRACKER, ("id",), now, PLACE_FIELDS, "MLFlowLogger", stacklevel=4)
        if found is None:
            return None
        resolution, path, identity = found
        run_id = str(identity["id"])
        problem = _unusable_run(tracking_uri, run_id)
        if problem:
            warn(
                f"MLFlowLogger: the recorded MLflow run {run_id!r} ({str(path)!r}) {problem}; a new "
                "run is created.",
                all_ranks=True,
                stacklevel=4,
            )
            return None
        log.info("Restart of run %s: MLflow continues run %s", resolution.run_id, run_id)
        return run_id


def _unusable_run(tracking_uri: str, run_id: str) -> str:
    """Why ``run_id`` cannot be continued in ``tracking_uri`` (``""`` when it can)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        run = MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException as e:
        return f"cannot be read ({e.error_code})"
    if run.info.lifecycle_stage == "deleted":
        return "was deleted"
    return ""
