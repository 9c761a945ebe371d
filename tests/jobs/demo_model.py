"""The small model and dataset the end-to-end jobs train (``tests/jobs/train_job.py`` builds on them).

Test-only scaffolding (until issue 44 they lived in the package's demo job).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import Dataset


class Noisy(Dataset):
    """Sized synthetic regression data: ``(x, y, index)``, ``x`` optionally jittered at random."""

    def __init__(self, n: int = 96, augment: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.x[i] + 0.05 * torch.randn(8) if self.augment else self.x[i]
        return x, self.y[i], torch.tensor(i)


class Model(pl.LightningModule):
    """A small MLP with dropout (so the random state matters) and a step-wise learning rate."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y, _ = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)]
