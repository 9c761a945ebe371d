"""A small Lightning training script that survives preemption. Every recipe runs this file.

    python train.py                                                   # plain run
    LIGHTNING_RESUME_KEY=exp-1 python train.py                        # rerun by hand with the same key
    srun python train.py                                              # SLURM (sbatch.sh)
    torchrun --standalone --nproc-per-node 2 train.py --devices 2     # torchrun (torchrun.sh)

Stop it with SIGTERM, SIGUSR1 or `kill -9`, start it again the same way, and it continues from its
newest checkpoint in the same run directory. A restart is recognised from SLURM's or TorchElastic's
restart count, or from an explicit key: `$LIGHTNING_RESUME_KEY` (or `RunDir(key=...)`).
"""

from __future__ import annotations

import argparse
import logging
import time

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import LocalLoggerResume, PreemptionHandler, RequeueCheckpoint, RunDir


class Regression(pl.LightningModule):
    """A small MLP (with dropout, so resuming must restore the random state as well)."""

    def __init__(self, lr: float = 0.01, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        if self.hparams.step_sleep:
            time.sleep(self.hparams.step_sleep)  # stands in for a real model: time to preempt by hand
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class RegressionData(pl.LightningDataModule):
    """Synthetic data, the same in every process and every attempt; shuffled every epoch."""

    def __init__(self, size: int = 512, batch_size: int = 16) -> None:
        super().__init__()
        self.size = size
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.size, 16, generator=g)
        y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(self.size, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--root", default="runs", help="folder of all runs and their index (default: runs)")
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps in total (default: 200)")
    parser.add_argument("--every", type=int, default=20, help="save last.ckpt every N steps (default: 20)")
    parser.add_argument("--devices", type=int, default=1, help="processes (GPUs, CPUs) per node (default: 1)")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes (default: 1)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep in each step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # lightning_resume logs which run dir it chose, what it resumes and how it stopped, at INFO.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pl.seed_everything(0)

    run_dir = RunDir(root=args.root)  # this run's directory, found again after a restart
    callbacks = [
        run_dir,
        RequeueCheckpoint(every_n_train_steps=args.every),  # last.ckpt, loaded by itself on a restart
        PreemptionHandler(),  # SIGTERM/SIGUSR1: save at the next step, requeue, exit with status 143
        LocalLoggerResume(),  # Lightning's default logger keeps one version dir, every step once
    ]
    # A tracker, continued across restarts (see the tracker resume page):
    #   from lightning.pytorch.loggers import WandbLogger; from lightning_resume import WandbResume
    #   logger = WandbLogger(project="demo"); callbacks.append(WandbResume())
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        devices=args.devices,
        num_nodes=args.num_nodes,
        deterministic=True,
        default_root_dir=run_dir.path,  # Lightning's own logs go into the run dir too
        callbacks=callbacks,
        enable_progress_bar=False,
    )
    trainer.fit(Regression(step_sleep=args.step_sleep), datamodule=RegressionData())
    if trainer.is_global_zero:
        print(f"finished at step {trainer.global_step} in {run_dir.path}")


if __name__ == "__main__":
    main()
