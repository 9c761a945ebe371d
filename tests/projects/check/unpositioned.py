"""A project whose train loader cannot be positioned: a batch sampler of its own, drawing the order
from torch's global generator. A mid-epoch restart cannot continue at its batch."""

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from lightning_resume import RequeueCheckpoint, RunDir


class ShuffledBatches(Sampler):
    def __init__(self, size: int, batch_size: int) -> None:
        self.size, self.batch_size = size, batch_size

    def __iter__(self):
        order = torch.randperm(self.size).tolist()
        return iter([order[i : i + self.batch_size] for i in range(0, self.size, self.batch_size)])

    def __len__(self) -> int:
        return self.size // self.batch_size


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
    pl.seed_everything(3)
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    dataset = TensorDataset(x, x.mean(1, keepdim=True))
    trainer = pl.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, callbacks=[RunDir(), RequeueCheckpoint()]
    )
    trainer.fit(Model(), DataLoader(dataset, batch_sampler=ShuffledBatches(len(dataset), 4)))
