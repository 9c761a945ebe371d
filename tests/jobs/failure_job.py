"""The failure classes' training job: a small model on one rank of several, with one real fault on one rank.

Run once per rank as ``python -m jobs.failure_job --root DIR --fault KIND`` with Lightning's multi-node
variables (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``WORLD_SIZE``), one device per "node", so that
each rank is a process of the test's own and its exit status is seen. ``--fault`` on ``--fault-rank`` at
global step ``--fault-at``:

- ``oom``: ``torch.OutOfMemoryError`` from the training step; ``error``: a ``KeyError`` there; ``bug``: a
  ``KeyError`` before the first step ends; ``nan``: a NaN loss under ``Trainer(detect_anomaly=True)``;
- ``worker``: the dataset raises in its DataLoader worker; ``timeout``: the rank sleeps past the
  process group's ``--pg-timeout`` (a gloo collective times out on the other); ``sigterm``: a SIGTERM to
  itself (``PreemptionHandler``); ``hang``: blocked for good (``ProgressWatchdog``, ``--watchdog``);
  ``kill``: SIGKILL to itself.

Test-only scaffolding: it is not shipped.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from lightning_resume import PreemptionHandler, ProgressWatchdog, RequeueCheckpoint, RunDir, WatchdogTimeouts


class Worker(RandomDataset):
    """Samples that raise in the DataLoader worker from ``index`` on (on the faulty rank)."""

    def __init__(self, faulty: bool, index: int) -> None:
        super().__init__(32, 64)
        self.faulty, self.index = faulty, index

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.faulty and index >= self.index:
            raise ValueError(f"sample {index} cannot be read")
        return super().__getitem__(index)


class Faulty(BoringModel):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        args, mine = self.args, self.global_rank == self.args.fault_rank
        if mine and self.global_step == args.fault_at:
            print(f"FAULT {args.fault} rank={self.global_rank} step={self.global_step}", flush=True)
            if args.fault == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            if args.fault in ("error", "bug"):
                raise KeyError("no such column")
            if args.fault == "nan":
                return {"loss": self.step(batch) * float("nan")}
            if args.fault == "timeout":
                time.sleep(args.pg_timeout + 25)
            if args.fault == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            if args.fault == "hang":
                threading.Event().wait()
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader:
        faulty = self.args.fault == "worker" and self.global_rank == self.args.fault_rank
        # 32 samples per rank, batch 1: index i of this rank's part is fetched at step i (one ahead).
        return DataLoader(Worker(faulty, 2 * self.args.fault_at), num_workers=1 if faulty else 0)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-at", type=int, default=2)
    p.add_argument("--pg-timeout", type=float, default=60.0, help="the process group's timeout (seconds)")
    p.add_argument("--watchdog", action="store_true", help="add ProgressWatchdog (4 s step timeout)")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--off", action="store_true", help="failure_classes=False")
    args = p.parse_args(argv)
    if args.fault == "bug":
        args.fault_at = 0
    pl.seed_everything(7)
    callbacks: list[pl.Callback] = [
        RunDir(root=args.root),
        RequeueCheckpoint(every_n_train_steps=100),
        PreemptionHandler(failure_classes=not args.off),
    ]
    if args.watchdog:
        timeouts = WatchdogTimeouts(first_step=120, step=4, minimum=4)
        callbacks.append(ProgressWatchdog(timeouts, max_attempts_without_progress=args.max_attempts))
    nodes = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=nodes,
        strategy=DDPStrategy(timeout=datetime.timedelta(seconds=args.pg_timeout)) if nodes > 1 else "auto",
        max_steps=8,
        callbacks=callbacks,
        detect_anomaly=args.fault == "nan",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=args.root,
    )
    trainer.fit(Faulty(args))


if __name__ == "__main__":
    main(sys.argv[1:])
