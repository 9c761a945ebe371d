"""``EpochBoundary``: the moment between two epochs, given to ``RequeueCheckpoint`` before any other hook.

An epoch's end runs in parts (validation, ``on_train_epoch_end`` of callbacks then module, plateau
schedulers, epoch metrics): a checkpoint written inside it misses what follows. The first moment after
it all is the next ``on_train_epoch_start``, where Lightning calls checkpoint callbacks last; this one,
first in the list during ``fit``, saves and restores there before any other hook.
"""

from __future__ import annotations

from typing import Protocol

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._compat.lightning import put_callback, take_callback


class Owner(Protocol):
    def _at_epoch_boundary(self, trainer: pl.Trainer) -> None: ...


class EpochBoundary(Callback):
    """Call ``owner._at_epoch_boundary`` at every ``on_train_epoch_start``, before the other callbacks."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    def attach(self, trainer: pl.Trainer) -> None:
        """Be the Trainer's first callback."""
        put_callback(trainer, self)

    def detach(self, trainer: pl.Trainer) -> None:
        take_callback(trainer, self)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.owner._at_epoch_boundary(trainer)
