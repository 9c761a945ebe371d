"""``WandbResume``: a restarted job continues its Weights & Biases run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import WandbLogger
from typing_extensions import override

from lightning_resume.trackers.tracker_resume import TrackerResume

# wandb's documented variables this callback reads or sets.
ENV = {"run_id": "WANDB_RUN_ID", "project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "mode": "WANDB_MODE"}
_MODES = {"dryrun": "offline", "run": "online"}  # wandb's aliases for its modes

WandbMode = Literal["online", "offline", "disabled", "shared"]


def normalize_mode(mode: str | None) -> str | None:
    """``"dryrun"`` -> ``"offline"``, ``"run"`` -> ``"online"``; other values unchanged."""
    return None if mode is None else _MODES.get(mode, mode)


class WandbResume(TrackerResume):
    """Make a restarted job continue the wandb run of its first attempt, with no throwaway run.

    Records ``id``, ``project``, ``entity``, ``name``, ``mode`` and ``dir`` (wandb's root dir) of the
    :class:`~lightning.pytorch.loggers.WandbLogger`'s run in ``<run dir>/wandb_resume.json`` and in every
    checkpoint. On a restart it sets ``WANDB_RUN_ID`` once it and the :class:`~lightning_resume.RunDir`
    exist (in any order), before Lightning creates the run, so ``wandb.init`` continues the recorded
    run; the variable is removed once the run exists.

    The restart is refused (one warning, a fresh run) when ``WANDB_PROJECT``, ``WANDB_ENTITY`` or
    ``WANDB_MODE`` changed, or an argument given here differs from the record. Settings given only to
    the ``WandbLogger`` are checked at ``setup``, after the run exists: pass them here too.

    wandb reads ``WANDB_RUN_ID`` once per process, when its session starts: construct this callback
    before ``wandb.login()``, ``wandb.setup()``, ``wandb.init()`` or the logger's ``experiment``.

    Args:
        project: The project, checked against the recorded run before resuming.
        entity: The entity (user or team), checked likewise.
        mode: ``"online"``, ``"offline"``, ``"disabled"`` or ``"shared"``, checked likewise.
        save_dir: wandb's root directory (``WandbLogger(save_dir=...)``), checked likewise.

    Raises:
        ModuleNotFoundError: when wandb is not installed.
        ValueError: for an unknown ``mode``; at ``setup`` when the Trainer logs to several wandb runs.

    Example::

        callbacks = [WandbResume(project="mnist"), RunDir(root="runs"), RequeueCheckpoint()]
        trainer = Trainer(logger=WandbLogger(project="mnist"), callbacks=callbacks)
        trainer.fit(model)  # a requeued job continues the same wandb run
    """

    tracker = "wandb"
    package = "wandb"
    logger_class = WandbLogger
    place_fields = ("project", "entity", "mode", "dir")
    # WANDB_DIR is not among them: WandbLogger passes its own save_dir (default ".") over it.
    placement_env = (ENV["project"], ENV["entity"], ENV["mode"])
    handback_caveat = (
        "; or wandb's session had started before WandbResume was constructed (wandb.login(), wandb.setup() "
        "or wandb.init() earlier in this process): wandb reads WANDB_RUN_ID once, when its session starts"
    )

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
    def _identity_of(self, logger: WandbLogger) -> dict[str, Any]:
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
