"""``EpochBoundary``: the moment between two epochs (the first after all of an epoch's end: the next
``on_train_epoch_start``), given to ``RequeueCheckpoint`` before any other hook."""

from __future__ import annotations

from collections.abc import Callable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class EpochBoundary(Callback):
    """Call ``at_boundary(trainer)`` at every ``on_train_epoch_start`` (put first among the callbacks)."""

    def __init__(self, at_boundary: Callable[[pl.Trainer], None]) -> None:
        self.at_boundary = at_boundary

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.at_boundary(trainer)
