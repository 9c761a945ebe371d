"""A project whose relaunch fails: it makes its output folder with ``os.makedirs`` and no ``exist_ok``,
so once the first attempt made it, every restart stops with ``FileExistsError`` before training."""

import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import RequeueCheckpoint, RunDir


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    os.makedirs("predictions")
    pl.seed_everything(0)
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, callbacks=[RunDir(), RequeueCheckpoint()]
    )
    trainer.fit(Model(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True))
