"""``TrackioResume``: a restarted job continues its trackio run."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_resume.trackers.loggers.trackio_logger import PLACE_FIELDS, TRACKER, TrackioLogger, storage_dir
from lightning_resume.trackers.tracker_resume import TrackerResume


class TrackioResume(TrackerResume):
    """Make a restarted job continue the trackio run of its first attempt, with no throwaway run.

    Records ``name``, ``id``, ``project``, ``group``, ``dir`` (``TRACKIO_DIR``) and ``url`` (a Space or
    server, if any) of the :class:`~lightning_resume.loggers.TrackioLogger`'s run in
    ``<run dir>/trackio_resume.json`` and in every checkpoint. On a restart the logger itself reads the
    sidecar when it creates its run (see there); this callback warns about an unreadable sidecar.

    Raises:
        ModuleNotFoundError: when trackio is not installed.
        ValueError: at ``setup`` when the Trainer logs to several trackio runs.

    Example::

        from lightning_resume.loggers import TrackioLogger

        callbacks = [TrackioResume(), RunDir(root="runs"), RequeueCheckpoint()]
        trainer = Trainer(logger=TrackioLogger(project="mnist"), callbacks=callbacks)
    """

    tracker = TRACKER
    package = "trackio"
    logger_class = TrackioLogger
    place_fields = PLACE_FIELDS
    required_fields = ("id", "name")

    @override
    def _identity_of(self, logger: TrackioLogger) -> dict[str, Any]:
        run = logger.experiment
        return {
            "id": run.id,
            "name": run.name,
            "project": run.project,
            "group": run.group,
            "dir": str(storage_dir()),
            "url": getattr(run, "url", None),
        }
