"""``WandbResume``: a restarted job continues its Weights & Biases run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger, WandbLogger
from typing_extensions import override

from lightning_resume.trackers.tracker_resume import TrackerResume

# wandb's documented environment variables that this callback reads or sets.
ENV = {
    "run_id": "WANDB_RUN_ID",
    "project": "WANDB_PROJECT",
    "entity": "WANDB_ENTITY",
    "mode": "WANDB_MODE",
}
# wandb's aliases for its modes.
_MODES = {"dryrun": "offline", "run": "online"}

WandbMode = Literal["online", "offline", "disabled", "shared"]


def normalize_mode(mode: str | None) -> str | None:
    """``"dryrun"`` -> ``"offline"``, ``"run"`` -> ``"online"``; other values unchanged."""
    return None if mode is None else _MODES.get(mode, mode)


class WandbResume(TrackerResume):
    """Make a restarted job continue the wandb run of its first attempt, with no throwaway run.

    Records ``id``, ``project``, ``entity``, ``name``, ``mode`` and ``dir`` (wandb's root dir) of the
    :class:`~lightning.pytorch.loggers.WandbLogger`'s run in ``<run dir>/wandb_resume.json`` and in every
    checkpoint. On a restart (see :class:`~lightning_resume.RunDir`) it sets ``WANDB_RUN_ID`` to the
    recorded id as soon as both callbacks exist, before Lightning creates the run: ``WandbLogger``
    passes no id of its own and ``resume="allow"``, so ``wandb.init`` continues the recorded run. The
    variable is removed again once the run exists.

    The restart is refused (one warning, a fresh wandb run, the checkpoint resume proceeds) when the
    run would be created somewhere else: ``WANDB_PROJECT``, ``WANDB_ENTITY`` or ``WANDB_MODE`` changed
    since the run was created, or an argument given here differs from the recorded run. Settings passed
    only to the ``WandbLogger`` (including its ``save_dir``) are not visible before the run exists; a
    change there is reported by a warning at ``setup`` (wandb then creates a new run with the same id
    in the new place). Pass them here as well to have them checked before the run is created.

    Needs a :class:`~lightning_resume.RunDir` (in any order). wandb reads ``WANDB_RUN_ID`` once per
    process, when its session starts: construct this callback before anything starts one
    (``wandb.login()``, ``wandb.setup()``, ``wandb.init()``, or the ``WandbLogger``'s ``experiment``);
    otherwise wandb creates a new run and ``setup`` says so.

    Args:
        project: The project the logger logs to, checked against the recorded run before resuming.
        entity: The entity (user or team), checked likewise.
        mode: ``"online"``, ``"offline"``, ``"disabled"`` or ``"shared"``, checked likewise.
        save_dir: wandb's root directory (``WandbLogger(save_dir=...)``), checked likewise.

    Raises:
        ModuleNotFoundError: when wandb is not installed.
        ValueError: for an unknown ``mode``; at ``setup`` when the Trainer logs to several wandb runs.

    Example::

        trainer = Trainer(
            logger=WandbLogger(project="mnist"),
            callbacks=[WandbResume(project="mnist"), RunDir(root="runs"), RequeueCheckpoint()],
        )
        trainer.fit(model)  # a requeued job continues the same wandb run
    """

    tracker = "wandb"
    package = "wandb"
    place_fields = ("project", "entity", "mode", "dir")
    # WANDB_DIR is not among them: WandbLogger passes its own save_dir (default ".") over it.
    placement_env = (ENV["project"], ENV["entity"], ENV["mode"])
    handback_caveat = (
        "; or wandb's session had started before WandbResume was constructed (wandb.login(), wandb.setup() "
        "or wandb.init() earlier in this process): wandb reads WANDB_RUN_ID once, when its session starts"
    )

    # Alike in every tracker on purpose (a duplicate-code report flags them): explicit, typed place
    # arguments are what LightningCLI parses and what is checked before the tracker creates its run.
    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        mode: WandbMode | None = None,
        save_dir: str | Path | None = None,
    ) -> None:
        if mode is not None and normalize_mode(mode) not in ("online", "offline", "disabled", "shared"):
            raise ValueError(f"mode must be 'online', 'offline', 'disabled', 'shared' or None, got {mode!r}.")
        self.project = project
        self.entity = entity
        self.mode = normalize_mode(mode)
        self.save_dir = None if save_dir is None else str(Path(save_dir).expanduser().resolve())
        super().__init__()

    @override
    def _loggers(self, trainer: pl.Trainer) -> list[Logger]:
        return [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]

    @override
    def _identity_of(self, logger: Logger) -> dict[str, Any]:
        assert isinstance(logger, WandbLogger)
        run = logger.experiment
        settings = run.settings
        root = getattr(settings, "root_dir", None)
        return {
            "id": run.id,
            "project": run.project or None,
            "entity": run.entity or None,
            "name": run.name or None,
            "mode": normalize_mode(getattr(settings, "mode", None)),
            "dir": os.path.abspath(root) if root else None,
        }

    @override
    def _expected(self) -> dict[str, Any]:
        return {"project": self.project, "entity": self.entity, "mode": self.mode, "dir": self.save_dir}

    @override
    def _hand_back(self, identity: Mapping[str, Any]) -> dict[str, str]:
        return {ENV["run_id"]: str(identity["id"])}
