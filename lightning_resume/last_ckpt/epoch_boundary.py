"""``EpochBoundary``: the moment between two epochs, given to ``RequeueCheckpoint`` before any other hook.

An epoch's end runs in parts: its validation, the callbacks' ``on_train_epoch_end`` (checkpoint
callbacks last), the module's, then Lightning steps ``ReduceLROnPlateau`` schedulers and logs the
epoch's metrics. A checkpoint written inside that sequence misses what follows it. The first moment
after all of it is the next epoch's ``on_train_epoch_start``, and Lightning calls checkpoint callbacks
(``RequeueCheckpoint`` is one) after all others. ``RequeueCheckpoint`` puts this small callback first
in the Trainer's list for the duration of ``fit``: it saves there, and a restart from that checkpoint
goes back there, before any other epoch-start hook runs.
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
