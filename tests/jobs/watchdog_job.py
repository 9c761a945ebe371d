"""The watchdog tests' training job: the demo's model and data under ``ProgressWatchdog``, with hangs,
crashes and slow steps on demand.

Run as ``python -m jobs.watchdog_job --root DIR --out FILE``. It writes the final weights to ``FILE``
(rank 0). A fault happens on the first attempt only (``--hang-*``: the attempt is told by
``TORCHELASTIC_RESTART_COUNT`` or ``SLURM_RESTART_COUNT``) or on every attempt (``--raise-at``).
Test-only scaffolding: it is not shipped.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from torch.utils.data import DataLoader

from jobs.train_job import Noisy, Probe, SlowValidation, loader
from lightning_resume import ProgressWatchdog, RequeueCheckpoint, RunDir, WatchdogTimeouts


def first_attempt() -> bool:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
    return int(restart) == 0


def block_forever(what: str, trainer: pl.Trainer) -> None:
    """Block this thread for good, in C (a sleep), as a rank stuck on a dead peer or device would."""
    print(
        f"HANG {what} rank={trainer.global_rank} step={trainer.global_step} t={time.time():.3f}", flush=True
    )
    threading.Event().wait()


class Faults(pl.Callback):
    """Hang (first attempt), raise (every attempt), or slow down the steps and validation."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.step_seconds = args.step_sleep

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        args = self.args
        mine = args.hang_rank in (None, trainer.global_rank)
        if args.hang == "step" and first_attempt() and mine and trainer.global_step == args.hang_at:
            block_forever("step", trainer)
        if args.raise_at is not None and trainer.global_step == args.raise_at:
            raise RuntimeError(f"boom at step {trainer.global_step}")
        if self.step_seconds:
            time.sleep(self.step_seconds)
            self.step_seconds *= args.step_growth


class HangingCheckpointIO(TorchCheckpointIO):
    """A checkpoint writer that never finishes the save of one step (first attempt)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if checkpoint.get("global_step") == self.step and first_attempt():
            print(f"HANG save step={self.step} t={time.time():.3f}", flush=True)
            threading.Event().wait()
        super().save_checkpoint(checkpoint, path, storage_options)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--nodes", type=int, default=1, help="Trainer(num_nodes=...)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--val", action="store_true", help="validate at every epoch end")
    p.add_argument("--val-batches", type=int, default=2)
    p.add_argument("--val-sleep", type=float, default=0.0)
    p.add_argument("--hang", choices=["step", "save"], default=None, help="step: at --hang-at (0: the first)")
    p.add_argument("--hang-at", type=int, default=0, help="global step of the hang")
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--raise-at", type=int, default=None, help="raise at this step, on every attempt")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--step-growth", type=float, default=1.0, help="each step sleeps this much longer")
    p.add_argument("--min-timeout", type=float, default=300.0)
    p.add_argument("--initial-timeout", type=float, default=1800.0)
    p.add_argument("--first-step-timeout", type=float, default=None)
    p.add_argument("--step-timeout", type=float, default=None)
    p.add_argument("--max-attempts", type=int, default=3)
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    pl.seed_everything(1234, workers=True)
    run_dir = RunDir(root=args.root)
    timeouts = WatchdogTimeouts(
        first_step=args.first_step_timeout,
        step=args.step_timeout,
        minimum=args.min_timeout,
        initial=args.initial_timeout,
    )
    watchdog = ProgressWatchdog(timeouts=timeouts, max_attempts_without_progress=args.max_attempts)
    callbacks: list[pl.Callback] = [
        Probe(),
        Faults(args),
        run_dir,
        RequeueCheckpoint(every_n_train_steps=args.every),
        watchdog,
    ]
    trainer = pl.Trainer(
        plugins=[HangingCheckpointIO(args.hang_at)] if args.hang == "save" else None,
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy="ddp" if args.devices * args.nodes > 1 else "auto",
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
        num_sanity_val_steps=0,
        limit_val_batches=args.val_batches if args.val else 0,
    )
    train = Noisy(args.samples)
    validation: DataLoader = loader("stateful", Noisy(32), 16, False)
    trainer.fit(
        SlowValidation(None, args.val_sleep),
        train_dataloaders=loader("stateful", train, 8, True),
        val_dataloaders=validation,
    )
    if trainer.is_global_zero:
        torch.save(trainer.lightning_module.state_dict(), args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
