"""A project that is not reproducible: its augmentation draws from numpy's generator, which nothing
seeds (no seed_everything), so two runs differ from the first step."""

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_resume import RequeueCheckpoint, RunDir


class Jittered(Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] + torch.from_numpy(np.random.normal(0, 0.1, 4)).float()
        return x, x.sum(0, keepdim=True)


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
    trainer = pl.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, callbacks=[RunDir(), RequeueCheckpoint()]
    )
    trainer.fit(Model(), DataLoader(Jittered(), batch_size=4, shuffle=True))
