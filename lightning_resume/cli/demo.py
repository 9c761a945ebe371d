"""The example ``lightning-resume demo`` checks: a shuffled ``DataLoader``, dropout, a learning-rate schedule
and a CSV logger make the random state, data position, optimizer and logs matter (``python -m`` trains it)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume.last_ckpt.requeue_checkpoint import RequeueCheckpoint
from lightning_resume.preemption.preemption_handler import PreemptionHandler
from lightning_resume.run_dir.run_dir import RunDir


def dataset(samples: int, seed: int) -> TensorDataset:
    """Noisy linear regression: ``y = x @ w + noise``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=g)
    return TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(samples, 1, generator=g))


class Model(pl.LightningModule):
    """A small MLP with dropout, Adam and a step-wise learning rate."""

    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)]


def main() -> None:
    pl.seed_everything(1234, workers=True)
    callbacks = [  # RequeueCheckpoint puts a LocalLoggerResume in for the CSV logger
        LearningRateMonitor(logging_interval="epoch"),
        RunDir(root="runs"),
        RequeueCheckpoint(every_n_train_steps=4),
        PreemptionHandler(),
        EarlyStopping(monitor="val_loss", patience=3),
    ]
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        deterministic=True,
        callbacks=callbacks,
        logger=CSVLogger("logs"),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train = DataLoader(dataset(96, 0), batch_size=8, shuffle=True)
    trainer.fit(Model(), train, DataLoader(dataset(32, 1), batch_size=16))


if __name__ == "__main__":
    main()
