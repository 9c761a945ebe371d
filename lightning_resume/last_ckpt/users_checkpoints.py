"""The user's ``ModelCheckpoint`` beside ``RequeueCheckpoint``: first, so that ``ckpt_path="best"`` reads it
as without us, and never saving its ``last.ckpt`` over ours."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

from lightning_resume._compat.lightning import SEVERAL_MODEL_CHECKPOINTS, QuietLightning, put_callback

log = logging.getLogger(__name__)

#: What a user's ``ModelCheckpoint(save_last=True)`` in the directory of our ``last.ckpt`` calls its own.
USERS_LAST = "last-model"


def _same_dir(dirpath: str | os.PathLike[str] | None, ours: Path) -> bool:
    if dirpath is None or "://" in str(dirpath):
        return False
    return os.path.realpath(os.path.expanduser(dirpath)) == os.path.realpath(ours)


def keep_off_our_last(trainer: pl.Trainer, our_dir: Path, our_name: str) -> None:
    """Rename to :data:`USERS_LAST` each ``ModelCheckpoint`` naming its last ``our_name`` in ``our_dir``."""
    renamed = [
        callback
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint)
        and callback.save_last
        and our_name == callback.CHECKPOINT_NAME_LAST
        and _same_dir(callback.dirpath, our_dir)
    ]
    for callback in renamed:
        callback.CHECKPOINT_NAME_LAST = USERS_LAST
    if renamed and trainer.is_global_zero:
        log.info(
            "ModelCheckpoint(save_last=True) saves its last checkpoint as %s.ckpt in %s: %s.ckpt there is "
            "RequeueCheckpoint's",
            USERS_LAST,
            our_dir,
            our_name,
        )


def model_checkpoint_first(trainer: pl.Trainer, ours: Checkpoint) -> QuietLightning | None:
    """Put ``ours`` just after the user's first ``ModelCheckpoint``; beside exactly one of the user's, silence
    Lightning's warning that ``"best"`` reads the first of several (returned: it lasts while it is kept)."""
    found = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
    if found and trainer.checkpoint_callbacks[0] is ours:
        put_callback(trainer, ours, after=found[0])
    others = [cb for cb in trainer.checkpoint_callbacks if cb is not ours]
    return QuietLightning(ours, SEVERAL_MODEL_CHECKPOINTS) if len(others) == 1 else None
