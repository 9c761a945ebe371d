"""``TrackioResume``: a restarted job continues its trackio run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger
from typing_extensions import override

from lightning_resume.trackers.loggers.trackio_logger import (
    PLACE_FIELDS,
    TRACKER,
    TrackioLogger,
    run_identity,
)
from lightning_resume.trackers.tracker_resume import TrackerResume


class TrackioResume(TrackerResume):
    """Make a restarted job continue the trackio run of its first attempt, with no throwaway run.

    Records ``name``, ``id`` (trackio's run id), ``project``, ``group``, ``dir`` (the storage dir,
    ``TRACKIO_DIR``) and ``url`` (a Space or server, if any) of the
    :class:`~lightning_resume.loggers.TrackioLogger`'s run in ``<run dir>/trackio_resume.json`` and in
    every checkpoint.

    trackio continues a run by name, and the logger creates its run lazily: on a restart the
    ``TrackioLogger`` reads the sidecar itself when Lightning first uses its ``experiment``, where its
    project and storage dir are known exactly. It continues the recorded run, or warns and creates a new
    one when either differs or another run of the project has the recorded name. This callback warns
    about an unreadable sidecar and keeps the sidecar and the checkpoint up to date.

    Raises:
        ModuleNotFoundError: when trackio is not installed.
        ValueError: at ``setup`` when the Trainer logs to several trackio runs.

    Example::

        from lightning_resume.loggers import TrackioLogger

        trainer = Trainer(
            logger=TrackioLogger(project="mnist"),
            callbacks=[TrackioResume(), RunDir(root="runs"), RequeueCheckpoint()],
        )
    """

    tracker = TRACKER
    package = "trackio"
    place_fields = PLACE_FIELDS
    required_fields = ("id", "name")

    @override
    def _loggers(self, trainer: pl.Trainer) -> list[Logger]:
        return [logger for logger in trainer.loggers if isinstance(logger, TrackioLogger)]

    @override
    def _identity_of(self, logger: Logger) -> dict[str, Any]:
        assert isinstance(logger, TrackioLogger)
        return run_identity(logger.experiment)

    # Each tracker's hooks have this shape on purpose: the base owns the logic, members fill one piece.
    @override
    def _hand_back(self, identity: Mapping[str, Any]) -> None:
        return None  # the TrackioLogger continues the recorded run when it creates its experiment
