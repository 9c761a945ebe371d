"""A training job on the standalone ``pytorch_lightning``, with ``lightning_resume.pytorch_lightning``.

Run as ``python -m jobs.pl_job --root DIR --out FILE [--kill-at N]``: the final weights go to ``FILE``;
``--kill-at N`` SIGKILLs the process at global step N. The Trainer, module and callbacks are all
``pytorch_lightning``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resume.pytorch_lightning import (
    DurableCheckpointIO,
    LocalLoggerResume,
    PreemptionHandler,
    RequeueCheckpoint,
    RunDir,
)


class Model(pl.LightningModule):
    """A small MLP with dropout, so the random state matters."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class KillAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-at", type=int, default=None)
    args = p.parse_args(argv)
    pl.seed_everything(1234, workers=True)
    run_dir = RunDir(root=args.root)
    callbacks: list[pl.Callback] = [
        RequeueCheckpoint(every_n_train_steps=3),
        run_dir,
        PreemptionHandler(),
        LocalLoggerResume(),
    ]
    if args.kill_at is not None:
        callbacks.insert(0, KillAt(args.kill_at))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    data = StatefulDataLoader(list(zip(x, x.sum(1, keepdim=True), strict=True)), batch_size=8, shuffle=True)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        callbacks=callbacks,
        plugins=[DurableCheckpointIO()],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
    )
    print("checkpoint callbacks:", [type(cb).__module__ for cb in trainer.checkpoint_callbacks], flush=True)
    trainer.fit(Model(), train_dataloaders=data)
    torch.save(trainer.lightning_module.state_dict(), args.out)
    with open(args.out + ".json", "w") as f:
        json.dump({"run_dir": str(run_dir.path), "resumed": run_dir.is_resumed}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
