"""``CometResume``: a restarted job continues its Comet experiment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CometLogger
from typing_extensions import override

from lightning_resume.trackers.tracker_resume import TrackerResume

# comet_ml's documented variables this callback reads or sets.
ENV = {
    "key": "COMET_EXPERIMENT_KEY",
    "project": "COMET_PROJECT_NAME",
    "workspace": "COMET_WORKSPACE",
    "online": "COMET_START_ONLINE",
    "dir": "COMET_OFFLINE_DIRECTORY",
}


class CometResume(TrackerResume):
    """Make a restarted job continue the Comet experiment of its first attempt.

    Records ``id`` (the experiment key), ``project``, ``workspace``, ``mode`` and ``dir`` (the offline
    directory) in ``<run dir>/comet_resume.json`` and in every checkpoint. On a restart it sets
    ``COMET_EXPERIMENT_KEY`` once it and the :class:`~lightning_resume.RunDir` exist, so that
    ``comet_ml.start`` continues that experiment; the variable is removed once it exists.

    Lightning's ``CometLogger`` starts its experiment in its constructor, so it must be built after
    both; :class:`lightning_resume.loggers.CometLogger` starts on first use and works in any order.

    Offline (``COMET_START_ONLINE=false``), every attempt writes its own archive with the same key, and
    ``comet upload`` appends them to one experiment. An attempt killed without warning (``SIGKILL``,
    out of memory) leaves an empty archive: its steps are lost; a preemption signal loses nothing.

    The restart is refused (one warning, a new experiment) when ``COMET_PROJECT_NAME``,
    ``COMET_WORKSPACE``, ``COMET_START_ONLINE`` or ``COMET_OFFLINE_DIRECTORY`` changed, or an argument
    given here differs from the record. Settings given only to the logger are checked at ``setup``.

    Args:
        project: The Comet project, checked against the recorded experiment.
        workspace: The Comet workspace, checked likewise.
        online: ``False`` for an offline experiment, checked likewise.
        offline_directory: Where offline archives go, checked likewise.

    Raises:
        ModuleNotFoundError: when comet_ml is not installed.
        ValueError: at ``setup`` when the Trainer logs to several Comet experiments.

    Example::

        from lightning_resume.loggers import CometLogger

        callbacks = [CometResume(project="mnist"), RunDir(root="runs"), RequeueCheckpoint()]
        trainer = Trainer(logger=CometLogger(project="mnist"), callbacks=callbacks)
    """

    tracker = "comet"
    package = "comet_ml"
    extra = "comet"
    logger_class = CometLogger
    place_fields = ("project", "workspace", "mode", "dir")
    placement_env = (ENV["project"], ENV["workspace"], ENV["online"], ENV["dir"])
    handback_caveat = (
        "; or the logger is Lightning's CometLogger, which starts its experiment when it is constructed: "
        "construct RunDir and CometResume before it, or use lightning_resume.loggers.CometLogger"
    )

    def __init__(
        self,
        project: str | None = None,
        workspace: str | None = None,
        online: bool | None = None,
        offline_directory: str | Path | None = None,
    ) -> None:
        self.project = project
        self.workspace = workspace
        self.online = online
        self.offline_directory = (
            None if offline_directory is None else str(Path(offline_directory).expanduser().resolve())
        )
        super().__init__()

    @override
    def _identity_of(self, logger: CometLogger) -> dict[str, Any]:
        experiment = logger.experiment
        if getattr(experiment, "disabled", False):
            self._warn(
                "the Comet experiment is disabled, so nothing is logged. Lightning's "
                "CometLogger(online=False) disables it (Lightning issue #21617): for an offline experiment "
                "leave online unset and set COMET_START_ONLINE=false."
            )
        offline = type(experiment).__name__ == "OfflineExperiment"
        directory = getattr(experiment, "offline_directory", None) if offline else None
        return {
            "id": experiment.get_key(),
            "project": experiment.project_name or None,
            "workspace": experiment.workspace or None,
            "mode": "offline" if offline else "online",
            "dir": os.path.abspath(directory) if directory else None,
        }

    @override
    def _expected(self) -> dict[str, Any]:
        mode = None if self.online is None else ("online" if self.online else "offline")
        return {
            "project": self.project,
            "workspace": self.workspace,
            "mode": mode,
            "dir": self.offline_directory,
        }

    @override
    def _hand_back(self, identity: Mapping[str, Any]) -> dict[str, str]:
        return {ENV["key"]: str(identity["id"])}
