"""Pins the one Lightning internal lightning_resume touches; fails loudly when Lightning changes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader

from lightning_resume._resume.lightning_internals import restart_train_iterator


class Recorder(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.arange(6, dtype=torch.float32).unsqueeze(1).repeat(1, 32), batch_size=1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen.append(int(batch[0, 0]))
        return super().training_step(batch, batch_idx)


def test_restart_train_iterator_rebuilds_the_iterator_training_uses(tmp_path: Path) -> None:
    class Reverse(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            trainer.train_dataloader.batch_sampler.sampler = list(reversed(range(6)))
            restart_train_iterator(trainer)

    model = Recorder()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[Reverse()],
    )
    trainer.fit(model)
    assert model.seen == [5, 4, 3, 2, 1, 0]
