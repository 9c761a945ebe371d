"""Resume time early vs late in a large epoch, for a plain DataLoader positioned by RequeueCheckpoint.

Prints one table measured side by side in one run: the time from ``trainer.fit`` to the first
resumed training step, for a checkpoint taken after the first batch and one taken at the last
batches of a 100k-sample epoch, plus what loading and discarding the consumed batches would cost.

    python benchmarks/resume_position.py [--samples 100000] [--batch-size 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import RequeueCheckpoint, RunDir


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Stop(Exception):
    """Ends the first fit mid-epoch, right after last.ckpt was written, as a kill would."""


class StopAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Stop


class FirstStep(pl.Callback):
    """Records when the first training batch starts."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_train_batch_start(self, *args: Any) -> None:
        if self.at is None:
            self.at = time.perf_counter()


def loader(samples: int, batch_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 16, generator=g), torch.randn(samples, 1, generator=g))
    return DataLoader(data, batch_size=batch_size, shuffle=True)


def fit(root: Path, key: str, step: int, samples: int, batch_size: int, stop: bool) -> float:
    """Train until ``step`` (``stop``) or resume from it; return seconds from fit() to the first step."""
    first = FirstStep()
    callbacks: list[pl.Callback] = [
        first,
        RunDir(root=root, key=key),
        RequeueCheckpoint(every_n_train_steps=step),
    ]
    if stop:
        callbacks.insert(0, StopAt(step))
    trainer = pl.Trainer(
        max_steps=step + 1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
        callbacks=callbacks,
    )
    start = time.perf_counter()
    with contextlib.suppress(Stop):
        trainer.fit(Tiny(), train_dataloaders=loader(samples, batch_size))
    assert first.at is not None
    return first.at - start


def discard_cost(batches: int, samples: int, batch_size: int) -> float:
    start = time.perf_counter()
    for _ in zip(range(batches), loader(samples, batch_size), strict=False):
        pass
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    batches = args.samples // args.batch_size
    positions = {"after batch 1": 1, f"after batch {batches - 1} (last but one)": batches - 1}
    times: dict[str, list[float]] = {name: [] for name in positions}
    with tempfile.TemporaryDirectory() as tmp:
        for name, step in positions.items():
            for repeat in range(args.repeats):
                key = f"{step}-{repeat}"
                fit(Path(tmp), key, step, args.samples, args.batch_size, stop=True)  # last.ckpt at `step`
                times[name].append(fit(Path(tmp), key, step, args.samples, args.batch_size, stop=False))
    early = statistics.median(times["after batch 1"])
    print(
        f"\nResume position, {args.samples} samples, batch {args.batch_size} ({batches} batches/epoch), "
        f"median of {args.repeats}"
    )
    print(f"{'resume':<34} {'fit() -> first step (s)':>24} {'ratio':>7}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<34} {median:>24.3f} {median / early:>7.2f}")
    discard = discard_cost(batches - 1, args.samples, args.batch_size)
    label = f"(load and discard {batches - 1} batches)"
    print(f"{label:<34} {discard:>24.3f} {discard / early:>7.2f}")


if __name__ == "__main__":
    main()
