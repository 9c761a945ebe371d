"""Two real projects' shapes retrofitted with the callbacks only (issue 41), written here by hand.

``--shape forecast`` (pytorch-forecasting's models): a pandas DataFrame among the hyperparameters
(strings, categories, timestamps), and ``on_save_checkpoint`` writes the loss and the logging metrics
(torchmetrics objects of the project's own) into ``checkpoint["hyper_parameters"]``. ``--shape kwargs``
(neuralforecast): the Trainer is built from keyword arguments with ``enable_checkpointing=False``.
``--standalone``: on ``pytorch_lightning`` with ``lightning_resume.pytorch_lightning``.

Run as ``python -m jobs.retrofit_job --root DIR --out FILE [--kill-at N]``: the final weights go to
``FILE``; ``--kill-at N`` SIGKILLs the process after global step N; ``--defaultdict`` adds a
hyperparameter no weights-only load can rebuild. Test-only scaffolding: it is not shipped.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
from typing import Any

import pandas as pd
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STANDALONE = "--standalone" in sys.argv
if STANDALONE:
    import pytorch_lightning as pl

    from lightning_resume.pytorch_lightning import DurableCheckpointIO, RequeueCheckpoint, RunDir
else:
    import lightning.pytorch as pl  # type: ignore[no-redef]

    from lightning_resume import DurableCheckpointIO, RequeueCheckpoint, RunDir  # type: ignore[assignment]


class QuantileLoss(torchmetrics.Metric):
    """The project's own loss, a torchmetrics metric with a list argument (as pytorch-forecasting's)."""

    def __init__(self, quantiles: list[float]) -> None:
        super().__init__()
        self.quantiles = quantiles
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, prediction: torch.Tensor, target: torch.Tensor) -> None:
        self.total += self.loss(prediction, target).detach()

    def compute(self) -> torch.Tensor:
        return self.total

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        errors = target - prediction
        return torch.stack(
            [torch.max((q - 1) * e, q * e) for q, e in zip(self.quantiles, errors.T, strict=True)]
        ).mean()


def frame(rows: int = 96) -> pd.DataFrame:
    """A time series table as the projects keep it: ids as strings and categories, timestamps, values."""
    return pd.DataFrame(
        {
            "series": [f"s{i % 4}" for i in range(rows)],
            "group": pd.Categorical([("a", "b")[i % 2] for i in range(rows)]),
            "time": pd.date_range("2024-01-01", periods=rows, freq="h"),
            "value": [float((i * 7) % 13) for i in range(rows)],
        }
    )


class Forecaster(pl.LightningModule):
    def __init__(self, data: pd.DataFrame, hidden: int = 16, extra: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.loss = QuantileLoss([0.1, 0.5, 0.9])
        self.logging_metrics = nn.ModuleList(
            [torchmetrics.MeanAbsoluteError(), torchmetrics.MeanSquaredError()]
        )
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 3))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        prediction = self.net(x)
        loss = self.loss.loss(prediction, y.expand(-1, 3))
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        return loader(self.hparams.data)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["hyper_parameters"]["loss"] = self.loss
        checkpoint["hyper_parameters"]["logging_metrics"] = self.logging_metrics


class KillAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def loader(data: pd.DataFrame) -> DataLoader:
    values = torch.tensor(data["value"].to_numpy(), dtype=torch.float32)
    x = torch.stack([values, values.roll(1), values.roll(2), torch.arange(len(values)) % 4.0], dim=1)
    return DataLoader(TensorDataset(x, values.roll(-1).unsqueeze(1)), batch_size=8, shuffle=True)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    for name in ("--root", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--shape", choices=["forecast", "kwargs"], default="forecast")
    p.add_argument("--durable", action="store_true", help="DurableCheckpointIO (asynchronous)")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--defaultdict", action="store_true", help="a collections.defaultdict hyperparameter")
    args = p.parse_args(argv)
    pl.seed_everything(1234, workers=True)
    data = frame()
    extra = collections.defaultdict(int, seen=1) if args.defaultdict else None
    model = Forecaster(data, extra=extra)
    callbacks: list[pl.Callback] = [
        RunDir(root=args.root, key="retrofit"),
        RequeueCheckpoint(every_n_train_steps=5),
    ]
    if args.kill_at is not None:
        callbacks.append(KillAt(args.kill_at))
    kwargs: dict[str, Any] = {
        "max_epochs": 3,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "deterministic": True,
        "callbacks": callbacks,
        "plugins": [DurableCheckpointIO()] if args.durable else [],
        "default_root_dir": args.root,
    }
    if args.shape == "kwargs":
        kwargs["enable_checkpointing"] = False  # what neuralforecast passes unless told otherwise
    trainer = pl.Trainer(**kwargs)
    trainer.fit(model)
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
