"""The demo's workload: a small, deterministic Lightning job that ``lightning-resume demo`` preempts.

Run as ``python -m lightning_resume.cli.demo_job --root DIR --out FILE``. It writes the final weights
to ``FILE`` and ``{"run_dir": ..., "resumed": ...}`` to ``FILE.json``. ``--kill-at N`` SIGKILLs the
process at global step N (a preemption with no warning); ``--preemption --signal-at N`` sends SIGTERM
as the step after N starts and lets ``PreemptionHandler`` save and exit (a graceful preemption).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_resume.last_ckpt.requeue_checkpoint import RequeueCheckpoint
from lightning_resume.preemption.preemption_handler import PreemptionHandler
from lightning_resume.preemption.signal_diagnostics import SignalDiagnostics
from lightning_resume.run_dir.run_dir import RunDir


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


class KillAt(pl.Callback):
    """SIGKILL the job at a given global step: a preemption with no warning."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step != self.step or trainer.global_rank != 0:
            return
        if trainer.world_size > 1:
            # The whole process group (the job's own session): no rank waits in a collective for a dead peer.
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class SignalAt(pl.Callback):
    """Send this process SIGTERM as the step after ``step`` starts: a scheduler's preemption."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.sent = False

    def on_train_batch_start(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=None, help="SIGKILL at this global step")
    p.add_argument("--preemption", action="store_true", help="add PreemptionHandler and SignalDiagnostics")
    p.add_argument("--signal-at", type=int, default=None, help="SIGTERM as this step's next batch starts")
    p.add_argument("--tracker", choices=["trackio"], default=None, help="log to trackio (TrackioResume)")
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    pl.seed_everything(1234, workers=True)
    run_dir = RunDir(root=args.root)
    callbacks: list[pl.Callback] = [RequeueCheckpoint(every_n_train_steps=args.every or None), run_dir]
    if args.kill_at is not None:
        callbacks.insert(0, KillAt(args.kill_at))
    if args.preemption:
        callbacks.extend([PreemptionHandler(), SignalDiagnostics()])
    if args.signal_at is not None:
        callbacks.insert(0, SignalAt(args.signal_at))
    logger: Any = False
    if args.tracker == "trackio":
        from lightning_resume.trackers.loggers.trackio_logger import TrackioLogger
        from lightning_resume.trackers.trackio_resume import TrackioResume

        logger = TrackioLogger(project="lightning-resume-demo", auto_log_cpu=False, auto_log_gpu=False)
        callbacks.append(TrackioResume())
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
    )
    train, val = DataLoader(Noisy(96), batch_size=8, shuffle=True), DataLoader(Noisy(32), batch_size=16)
    trainer.fit(Model(), train_dataloaders=train, val_dataloaders=val)
    torch.save(trainer.lightning_module.state_dict(), args.out)
    with open(args.out + ".json", "w") as f:
        json.dump({"run_dir": str(run_dir.path), "resumed": run_dir.is_resumed}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
