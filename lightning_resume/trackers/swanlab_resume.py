"""``SwanLabResume``: a restarted job continues its SwanLab experiment."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger
from typing_extensions import override

from lightning_resume._compat.swanlab import swanlab_place
from lightning_resume.trackers.tracker_resume import TrackerResume

# SwanLab's documented variables this callback reads or sets (docs.swanlab.cn/en/api/environment-variable).
ENV = {
    "run_id": "SWANLAB_RUN_ID",
    "resume": "SWANLAB_RESUME",
    "name": "SWANLAB_EXP_NAME",
    "project": "SWANLAB_PROJ_NAME",
    "workspace": "SWANLAB_WORKSPACE",
    "mode": "SWANLAB_MODE",
    "dir": "SWANLAB_LOG_DIR",
}
_LOGGER_MODULE = "swanlab.integration.pytorch_lightning"

SwanLabMode = Literal["online", "offline", "local", "disabled"]


class SwanLabResume(TrackerResume):
    """Make a restarted job continue the SwanLab experiment of its first attempt, with no throwaway run.

    Records ``id``, ``name``, ``project``, ``workspace``, ``mode`` and ``dir`` (the log dir) of the
    ``swanlab.integration.pytorch_lightning.SwanLabLogger``'s run in ``<run dir>/swanlab_resume.json``
    and in every checkpoint. On a restart it sets ``SWANLAB_RUN_ID``, ``SWANLAB_RESUME=allow`` and
    ``SWANLAB_EXP_NAME`` (else an offline run gets a new random name) once it and the
    :class:`~lightning_resume.RunDir` exist, before Lightning creates the run; they are removed once
    the run exists.

    The restart is refused (one warning, a fresh run) when ``SWANLAB_PROJ_NAME``,
    ``SWANLAB_WORKSPACE``, ``SWANLAB_MODE`` or ``SWANLAB_LOG_DIR`` changed, or an argument given here
    differs from the record. Settings given only to the logger are checked at ``setup``: pass them
    here too.

    Args:
        project: The project, checked against the recorded run before resuming.
        workspace: The workspace, checked likewise.
        mode: ``"online"``, ``"offline"``, ``"local"`` or ``"disabled"``, checked likewise.
        log_dir: The logger's ``log_dir``, checked likewise.

    Raises:
        ModuleNotFoundError: when swanlab is not installed.
        ValueError: for an unknown ``mode``; at ``setup`` when the Trainer logs to several runs.

    Example::

        from swanlab.integration.pytorch_lightning import SwanLabLogger

        callbacks = [RunDir(root="runs"), SwanLabResume(project="mnist"), RequeueCheckpoint()]
        trainer = Trainer(logger=SwanLabLogger(project="mnist", mode="offline"), callbacks=callbacks)
    """

    tracker = "swanlab"
    package = "swanlab"
    place_fields = ("project", "workspace", "mode", "dir")
    placement_env = (ENV["project"], ENV["workspace"], ENV["mode"], ENV["dir"])

    def __init__(
        self,
        project: str | None = None,
        workspace: str | None = None,
        mode: SwanLabMode | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        if mode is not None and mode not in ("online", "offline", "local", "disabled"):
            raise ValueError(f"mode must be 'online', 'offline', 'local', 'disabled' or None, got {mode!r}.")
        self.project = project
        self.workspace = workspace
        self.mode = mode
        self.log_dir = None if log_dir is None else str(Path(log_dir).expanduser().resolve())
        super().__init__()

    @override
    def _loggers(self, trainer: pl.Trainer) -> list[Logger]:
        # No SwanLabLogger can exist unless its module was imported: no need to import swanlab here.
        logger_class = getattr(sys.modules.get(_LOGGER_MODULE), "SwanLabLogger", None)
        return [logger for logger in trainer.loggers if logger_class and isinstance(logger, logger_class)]

    @override
    def _identity_of(self, logger: Any) -> dict[str, Any]:
        run = logger.experiment
        project, workspace = swanlab_place(run)
        return {
            "id": run.id,
            "name": run.name or None,
            "project": project,
            "workspace": workspace,
            "mode": run.mode,
            "dir": str(Path(run.dir).resolve().parent),
        }

    @override
    def _expected(self) -> dict[str, Any]:
        return {"project": self.project, "workspace": self.workspace, "mode": self.mode, "dir": self.log_dir}

    @override
    def _hand_back(self, identity: Mapping[str, Any]) -> dict[str, str]:
        env = {ENV["run_id"]: str(identity["id"]), ENV["resume"]: "allow"}
        if identity.get("name"):
            env[ENV["name"]] = str(identity["name"])
        return env
