"""A tiny Lightning job that logs to one real tracker, for the tracker resume tests.

Run as ``python tests/jobs/tracker_job.py --root DIR --tracker wandb|trackio|swanlab --out FILE``. Every step
logs ``loss`` and ``echo`` (the step it belongs to, so a reader can check that each row sits at its
own step). ``--kill-at N`` signals the process at global step N: ``term`` is a preemption notice
(Lightning stops at the batch boundary and ``RequeueCheckpoint`` saves), ``kill`` a hard SIGKILL. The
logger is constructed first and the resume callback is listed before ``RunDir``, the orders the
binding must cope with. On completion ``FILE`` gets ``{"run_dir": ..., "resumed": ...}``.

For the local loggers' exact cut: ``--epochs E`` splits the steps into E epochs, ``--validate`` adds
the model's hyperparameters and an epoch-end validation logging ``val_loss`` and, to TensorBoard, a
figure, a histogram and a text at the epoch's last step, ``--lr-monitor`` a ``LearningRateMonitor``
logging an epoch-interval ``StepLR``'s rate as each epoch starts (``--lr-monitor-first``: listed before
the resume callback), ``--preemption-handler`` a ``PreemptionHandler``. ``--kill-in val`` signals in the
first validation batch at or after step N (not the sanity check), ``epoch_start`` as the first batch of
an epoch starts at or after step N (the epoch-end save written, the epoch-start rate logged).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import (
    CometResume,
    LocalLoggerResume,
    MLflowResume,
    RequeueCheckpoint,
    RunDir,
    SwanLabResume,
    TrackioResume,
    WandbResume,
)

BATCH = 4


class Model(pl.LightningModule):
    def __init__(self, schedule: bool = False, hparams: bool = False) -> None:
        super().__init__()
        if hparams:  # TensorBoard then logs them and its hp_metric placeholder as every fit starts
            self.save_hyperparameters()
        self.net = nn.Linear(8, 1)
        self.schedule = schedule

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        self.log("echo", float(self.global_step))
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt

                figure = plt.figure(figsize=(2, 2), dpi=30)
                plt.plot(self.net.weight.detach().flatten().tolist())
                writer, step = logger.experiment, self.global_step
                writer.add_figure("weights", figure, step)
                writer.add_histogram("weight_values", self.net.weight.detach(), step)
                writer.add_text("note", f"validated at step {step}", step)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        if not self.schedule:
            return opt
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


class KillAt(pl.Callback):
    """Signal this process at a global step, after the step's checkpoint (if any) was written; ``where``:
    ``val`` the first validation batch, ``epoch_start`` an epoch's first batch start."""

    def __init__(self, step: int, how: str, where: str = "step") -> None:
        self.step, self.where = step, where
        self.signal = signal.SIGTERM if how == "term" else signal.SIGKILL

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if self.where == "step" and trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if self.where == "val" and not trainer.sanity_checking and trainer.global_step >= self.step:
            self.where = "done"  # a SIGTERM is acted on later: once
            os.kill(os.getpid(), self.signal)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: object, batch: object, i: int) -> None:
        if self.where == "epoch_start" and i == 0 and trainer.global_step >= self.step:
            os.kill(os.getpid(), self.signal)


def make_logger(tracker: str, project: str, save_dir: str) -> tuple[Any, pl.Callback]:
    if tracker in ("default", "default-csv"):
        if tracker == "default-csv":
            # As in an environment without tensorboard: Lightning's default logger is then a CSVLogger.
            from lightning.pytorch.trainer.connectors.logger_connector import logger_connector

            logger_connector._TENSORBOARD_AVAILABLE = False
            logger_connector._TENSORBOARDX_AVAILABLE = False
        return None, LocalLoggerResume()
    if tracker == "local":
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        # Both with a fixed version: the case where CSVLogger deletes metrics.csv before any hook.
        loggers = [TensorBoardLogger(save_dir, version="fixed"), CSVLogger(save_dir, version=0)]
        return loggers, LocalLoggerResume()
    if tracker in ("mlflow", "mlflow-lightning"):
        from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger

        from lightning_resume.loggers import MLFlowLogger

        kind = MLFlowLogger if tracker == "mlflow" else LightningMLFlowLogger
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{os.path.abspath(save_dir)}/mlruns"
        return kind(experiment_name=project, tracking_uri=uri), MLflowResume()
    if tracker == "comet":
        from lightning_resume.loggers import CometLogger

        # Built first, as LightningCLI builds it: this logger starts its experiment on first use.
        os.makedirs(save_dir, exist_ok=True)  # comet makes the offline dir, not its parents
        return CometLogger(project=project, offline_directory=os.path.join(save_dir, "comet")), CometResume()
    if tracker == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project=project, save_dir=save_dir), WandbResume()
    if tracker == "swanlab":
        from swanlab.integration.pytorch_lightning import SwanLabLogger

        return SwanLabLogger(project=project, log_dir=save_dir), SwanLabResume()
    from lightning_resume.loggers import TrackioLogger

    return TrackioLogger(project=project, auto_log_cpu=False, auto_log_gpu=False), TrackioResume()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument(
        "--tracker",
        choices=[
            "wandb",
            "trackio",
            "swanlab",
            "default",
            "default-csv",
            "local",
            "mlflow",
            "mlflow-lightning",
            "comet",
        ],
        required=True,
        help="default, default-csv: Lightning's default logger; local: TensorBoardLogger and CSVLogger; "
        "mlflow: our MLFlowLogger, mlflow-lightning: Lightning's; comet: our CometLogger",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--project", default="resume-test")
    p.add_argument("--save-dir", default="trackers")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--signal", choices=["term", "kill"], default="term")
    p.add_argument("--kill-in", choices=["step", "val", "epoch_start"], default="step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--validate", action="store_true")
    p.add_argument("--lr-monitor", action="store_true")
    p.add_argument("--lr-monitor-first", action="store_true")
    p.add_argument("--preemption-handler", action="store_true")
    p.add_argument("--no-resume", action="store_true", help="leave the tracker resume callback out")
    args = p.parse_args(argv)

    pl.seed_everything(0)
    logger, resume = make_logger(args.tracker, args.project, args.save_dir)
    callbacks: list[pl.Callback] = [] if args.no_resume else [resume]
    callbacks += [RequeueCheckpoint(every_n_train_steps=args.every), RunDir(root=args.root)]
    if args.preemption_handler:
        from lightning_resume import PreemptionHandler

        callbacks.append(PreemptionHandler())
    if args.lr_monitor or args.lr_monitor_first:
        from lightning.pytorch.callbacks import LearningRateMonitor

        callbacks.insert(0 if args.lr_monitor_first else len(callbacks), LearningRateMonitor())
    if args.kill_at is not None:
        # A SIGTERM is handled at the batch boundary, after this step's save; a SIGKILL lands before it,
        # so the newest checkpoint is the previous step's, whose metrics were logged just after it.
        kill = KillAt(args.kill_at, args.signal, args.kill_in)
        callbacks.insert(len(callbacks) if args.signal == "term" else 0, kill)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps // args.epochs * BATCH, 8, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)
    x_val = torch.randn(2 * BATCH, 8, generator=g)
    val = DataLoader(TensorDataset(x_val, x_val.sum(1, keepdim=True)), batch_size=BATCH)
    trainer = pl.Trainer(
        max_steps=args.steps,
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=logger,
        callbacks=callbacks,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=None if args.validate else 0,
    )
    model = Model(schedule=args.lr_monitor or args.lr_monitor_first, hparams=args.validate)
    trainer.fit(model, train_dataloaders=data, val_dataloaders=val if args.validate else None)
    run_dir = next(cb for cb in callbacks if isinstance(cb, RunDir))
    with open(args.out, "w") as f:
        json.dump({"run_dir": str(run_dir.path), "resumed": run_dir.is_resumed}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
