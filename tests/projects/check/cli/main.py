"""A LightningCLI project: the Trainer, its logger and callbacks come from config.yaml.

python main.py fit --config config.yaml
"""

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(5, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean(), on_epoch=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9),
        }


class Blobs(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (80,), generator=g)
        x = torch.randn(80, 5, generator=g) + y[:, None]
        self.train, self.val = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


if __name__ == "__main__":
    LightningCLI(Classifier, Blobs)
