"""The end-to-end tests' training job: the demo's model and data, with every knob the tests turn.

Run as ``python tests/jobs/train_job.py --root DIR --out FILE``. It writes the final weights to
``FILE`` and ``{"run_dir": ..., "resumed": ...}`` to ``FILE.json``; ``--kill-at N`` SIGKILLs the
process at global step N, a preemption with no warning. Test-only scaffolding: it is not shipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resume import (
    DurableCheckpointIO,
    PreemptionHandler,
    RequeueCheckpoint,
    RunDir,
    SignalDiagnostics,
)
from lightning_resume.cli.demo_job import KillAt, Noisy
from lightning_resume.cli.demo_job import Model as DemoModel


class Model(DemoModel):
    """The demo's model; writes the sample indices of every training batch when asked to."""

    def __init__(self, sample_log: str | None = None) -> None:
        super().__init__()
        self.sample_log = sample_log

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.sample_log:
            index = batch[2]
            _append(f"{self.sample_log}.rank{self.global_rank}", " ".join(map(str, index.tolist())) + "\n")
        return super().training_step(batch, batch_idx)


class SignalAt(pl.Callback):
    """Send this process a real signal as the step after ``step`` starts, on one rank (or all).

    With ``count > 1`` the further signals arrive while the next checkpoint is being written.
    """

    def __init__(self, step: int, name: str, rank: int | None, count: int) -> None:
        self.step, self.sig, self.rank, self.remaining = step, signal.Signals[name], rank, count

    def _send(self) -> None:
        self.remaining -= 1
        os.kill(os.getpid(), self.sig)

    def on_train_batch_start(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank) and self.remaining:
            self._send()

    def on_save_checkpoint(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step > self.step and self.remaining:
            self._send()


class Slow(pl.Callback):
    """Sleep after every step, so a scheduler has time to act in the middle of training."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)


def loader(
    kind: str, ds: Dataset, batch_size: int, shuffle: bool, workers: int = 0, drop_last: bool = False
) -> DataLoader:
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "num_workers": workers,
        "drop_last": drop_last,
    }
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, **options)
    return DataLoader(ds, **options)


def _append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


# A node-local checkpoint directory, expanded by the process that uses it.
LOCAL_CKPT = "$TMPDIR/ckpt"


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
    p.add_argument("--sample-log", default=None, help="write each training batch's sample indices here")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--augment", action="store_true", help="random jitter inside the dataset")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--no-requeue", action="store_true", help="leave RequeueCheckpoint out")
    p.add_argument("--no-epoch-end", action="store_true", help="no epoch-end save")
    p.add_argument(
        "--tracker", choices=["trackio"], default=None, help="log to trackio, resumed by TrackioResume"
    )
    p.add_argument("--preemption", action="store_true", help="add PreemptionHandler and SignalDiagnostics")
    p.add_argument(
        "--signal-at", type=int, default=None, help="send a signal as this step's next batch starts"
    )
    p.add_argument("--signal-name", default="SIGTERM")
    p.add_argument("--signal-rank", type=int, default=None)
    p.add_argument("--signal-count", type=int, default=1)
    p.add_argument("--step-sleep", type=float, default=0.0, help="sleep after each step (a slow job)")
    p.add_argument("--setup-sleep", type=float, default=0.0, help="sleep before fit (a slow setup window)")
    p.add_argument("--before", choices=["ignore", "user"], default=None, help="SIGTERM handler before ours")
    p.add_argument("--durable", action="store_true", help="save through DurableCheckpointIO (asynchronous)")
    p.add_argument("--mirror", default=None, help="DurableCheckpointIO(mirror=URL)")
    p.add_argument("--nodes", type=int, default=1, help="Trainer(num_nodes=...)")
    p.add_argument("--local-ckpt", action="store_true", help="last.ckpt in $TMPDIR/ckpt (node-local)")
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    pl.seed_everything(1234, workers=True)
    if args.before == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.before == "user":
        signal.signal(signal.SIGTERM, lambda *_: _append(args.out + ".user-handler", "called\n"))
    run_dir = RunDir(root=args.root, key=args.key)
    callbacks: list[pl.Callback] = [run_dir]
    if not args.no_requeue:
        callbacks.insert(
            0,
            RequeueCheckpoint(
                every_n_train_steps=args.every or None,
                save_on_train_epoch_end=not args.no_epoch_end,
                dirpath=LOCAL_CKPT if args.local_ckpt else None,
            ),
        )
    if args.kill_at is not None:
        callbacks.insert(0, KillAt(args.kill_at))
    if args.step_sleep:
        callbacks.insert(0, Slow(args.step_sleep))
    if args.preemption:
        callbacks.extend([PreemptionHandler(), SignalDiagnostics()])
    if args.signal_at is not None:
        callbacks.insert(0, SignalAt(args.signal_at, args.signal_name, args.signal_rank, args.signal_count))
    logger: Any = False
    if args.tracker == "trackio":
        from lightning_resume import TrackioResume
        from lightning_resume.loggers import TrackioLogger

        logger = TrackioLogger(project="lightning-resume-demo", auto_log_cpu=False, auto_log_gpu=False)
        callbacks.append(TrackioResume())
    trainer = pl.Trainer(
        plugins=[DurableCheckpointIO(mirror=args.mirror, dirpath=LOCAL_CKPT if args.local_ckpt else None)]
        if args.durable or args.mirror
        else None,
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy="ddp" if args.devices * args.nodes > 1 else "auto",
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=args.progress,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
    )
    if args.setup_sleep:
        with open(args.out + ".setup", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(args.setup_sleep)
    train = Noisy(args.samples, augment=args.augment)
    trainer.fit(
        Model(args.sample_log),
        train_dataloaders=loader(args.loader, train, args.batch_size, True, args.workers, args.drop_last),
        val_dataloaders=loader(args.loader, Noisy(32), 16, shuffle=False),
        ckpt_path=args.ckpt_path,
    )
    if trainer.is_global_zero:
        torch.save(trainer.lightning_module.state_dict(), args.out)
        with open(args.out + ".json", "w") as f:
            json.dump({"run_dir": str(run_dir.path), "resumed": run_dir.is_resumed}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
