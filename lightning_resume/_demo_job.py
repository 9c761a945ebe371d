"""A small, deterministic Lightning job: the demo's workload and the end-to-end tests'.

Run as ``python -m lightning_resume._demo_job --root DIR --out FILE``. It writes the final weights
to ``FILE`` and ``{"run_dir": ..., "resumed": ...}`` to ``FILE.json``; ``--kill-at N`` SIGKILLs the
process at global step N, a preemption with no warning.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_resume import RequeueCheckpoint, RunDir


class Noisy(Dataset):
    """Sized synthetic regression data; logs every sample index it serves when asked to."""

    def __init__(self, n: int = 96, log: str | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
        self.log = log

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{i}\n")
        return self.x[i], self.y[i]


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)]


class KillAt(pl.Callback):
    """SIGKILL this process at a given global step: a preemption with no warning."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def loader(kind: str, ds: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, batch_size=batch_size, shuffle=shuffle)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--key", default=None)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--loader", choices=["stateful", "plain"], default="stateful")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--sample-log", default=None)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--no-requeue", action="store_true", help="leave RequeueCheckpoint out")
    p.add_argument("--no-epoch-end", action="store_true", help="no epoch-end save")
    args = p.parse_args(argv)

    pl.seed_everything(1234, workers=True)
    run_dir = RunDir(root=args.root, key=args.key)
    callbacks: list[pl.Callback] = [run_dir]
    if not args.no_requeue:
        callbacks.insert(
            0,
            RequeueCheckpoint(
                every_n_train_steps=args.every or None, save_on_train_epoch_end=not args.no_epoch_end
            ),
        )
    if args.kill_at is not None:
        callbacks.insert(0, KillAt(args.kill_at))
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=args.progress,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
    )
    train = Noisy(log=args.sample_log)
    trainer.fit(
        Model(),
        train_dataloaders=loader(args.loader, train, 8, shuffle=True),
        val_dataloaders=loader(args.loader, Noisy(32), 16, shuffle=False),
        ckpt_path=args.ckpt_path,
    )
    if trainer.is_global_zero:
        torch.save(trainer.lightning_module.state_dict(), args.out)
        with open(args.out + ".json", "w") as f:
            json.dump({"run_dir": str(run_dir.path), "resumed": run_dir.is_resumed}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
