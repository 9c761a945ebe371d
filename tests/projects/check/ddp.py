"""Two ranks on the CPU with Lightning's own launcher (it runs this script again for rank 1)."""

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import PreemptionHandler, RequeueCheckpoint, RunDir


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


if __name__ == "__main__":
    pl.seed_everything(5, workers=True)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        deterministic=True,
        logger=False,
        enable_progress_bar=False,
        callbacks=[RunDir(), RequeueCheckpoint(every_n_train_steps=2), PreemptionHandler()],
    )
    trainer.fit(Model(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True))
