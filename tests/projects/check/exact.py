"""A small project as a user writes it: plain shuffled loaders, TensorBoard, EarlyStopping, a learning
rate logged as each epoch starts, and the callbacks of the README (``RequeueCheckpoint`` puts
``LocalLoggerResume`` in). ``lightning-resume check`` finds it exact."""

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import PreemptionHandler, RequeueCheckpoint, RunDir


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


if __name__ == "__main__":
    pl.seed_everything(7, workers=True)
    trainer = pl.Trainer(
        max_epochs=4,
        deterministic=True,
        logger=TensorBoardLogger("tb_logs"),
        log_every_n_steps=2,
        enable_progress_bar=False,
        callbacks=[
            LearningRateMonitor(logging_interval="epoch"),
            RunDir("runs"),
            RequeueCheckpoint(every_n_minutes=30),
            PreemptionHandler(),
            EarlyStopping("val_loss", patience=2),
        ],
    )
    trainer.fit(
        Regressor(),
        DataLoader(data(48, 0), batch_size=6, shuffle=True),
        DataLoader(data(12, 1), batch_size=6),
    )
