"""The user's ``ModelCheckpoint`` beside ``RequeueCheckpoint``: as without us, and never on our file.

``RequeueCheckpoint`` is a Lightning ``Checkpoint`` (so that ``fit`` resumes from it), so
``trainer.checkpoint_callback`` (what ``ckpt_path="best"`` reads) is the first ``Checkpoint`` listed,
maybe ours: the user's first ``ModelCheckpoint`` goes before it. (Without one, Lightning leaves its
default ``ModelCheckpoint`` out, and ``RequeueCheckpoint.best_model_path`` answers as that default
would: the newest save.) And a ``ModelCheckpoint(save_last=True)`` in our directory would write
``last.ckpt`` too.
"""

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


def keep_off_our_last(trainer: pl.Trainer, our_dir: Path, our_name: str) -> list[ModelCheckpoint]:
    """Give each ``ModelCheckpoint(save_last=...)`` saving into ``our_dir`` under ``our_name`` the name
    :data:`USERS_LAST` (Lightning's own setting, ``CHECKPOINT_NAME_LAST``). Returns those renamed."""
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
    return renamed


def model_checkpoint_first(trainer: pl.Trainer, ours: Checkpoint) -> QuietLightning | None:
    """Make the user's first ``ModelCheckpoint``, if any, ``trainer.checkpoint_callback``: ``ours``
    goes just after it. Beside exactly one of the user's checkpoint callbacks, Lightning's warning
    that ``"best"`` reads the first of several is silenced (returned: it lasts while it is kept)."""
    found = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
    if found and trainer.checkpoint_callbacks[0] is ours:
        put_callback(trainer, ours, after=found[0])
    others = [cb for cb in trainer.checkpoint_callbacks if cb is not ours]
    return QuietLightning(ours, SEVERAL_MODEL_CHECKPOINTS) if len(others) == 1 else None
