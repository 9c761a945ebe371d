"""What the per-step "did any rank get a preemption signal?" agreement costs, at 2 DDP ranks.

``PreemptionHandler`` asks every rank at the same batch whether any rank received a signal
(``lightning_resume._collectives.any_rank``: Lightning's ``reduce_boolean_decision``, a barrier and an
all-reduce, tensors on ``strategy.root_device``). On a GPU step of 100 ms it is noise; on a toy CPU
step it is visible, which is what this measures. Rows, interleaved over rounds in one launch (2 gloo
ranks, Lightning's launcher, a tiny MLP):

- ``none``: no agreement (Lightning still broadcasts its own SIGTERM flag every DDP step);
- ``every step``: ``PreemptionHandler(check_every_n_steps=1)``, the default;
- ``every 10th``: ``PreemptionHandler(check_every_n_steps=10)``.

Columns: the median step time (between consecutive ``on_train_batch_end``), its ratio to ``none``, and
the median time inside the collective per call. Usage: ``python benchmarks/preemption_agreement.py
[--steps 400] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from lightning_resume._collectives import any_rank

ROWS = {"none": 0, "every step": 1, "every 10th": 10}


class Tiny(pl.LightningModule):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        n = 8 * 2 * self.steps
        data = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=8)


class Agree(pl.Callback):
    """The agreement ``PreemptionHandler`` runs at a batch end, every ``every`` batches, timed."""

    def __init__(self, every: int) -> None:
        self.every, self.batches = every, 0
        self.ends: list[float] = []
        self.inside: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.batches += 1
        start = time.perf_counter()
        if self.every and self.batches % self.every == 0:
            any_rank(trainer.strategy, False)
            self.inside.append(time.perf_counter() - start)
        self.ends.append(time.perf_counter())


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=400, help="training steps per row and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; rows are interleaved within each")
    args = parser.parse_args()
    steps: dict[str, list[float]] = {row: [] for row in ROWS}
    inside: dict[str, list[float]] = {row: [] for row in ROWS}
    trainer: pl.Trainer | None = None
    for _ in range(args.rounds):
        for row, every in ROWS.items():
            probe = Agree(every)
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=2,
                strategy="ddp",
                max_steps=args.steps,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                limit_val_batches=0,
                callbacks=[probe],
            )
            trainer.fit(Tiny(args.steps))
            gaps = [b - a for a, b in zip(probe.ends[20:-1], probe.ends[21:], strict=True)]
            steps[row].append(statistics.median(gaps))
            if probe.inside:
                inside[row].append(statistics.median(probe.inside[2:] or probe.inside))
    if trainer is None or trainer.global_rank != 0:
        return
    base = statistics.median(steps["none"])
    print(f"2 gloo ranks, {args.steps} steps x {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}")
    print(f"{'row':12} {'median step ms':>15} {'x none':>7} {'collective us/call':>19}")
    for row in ROWS:
        step = statistics.median(steps[row])
        call = f"{statistics.median(inside[row]) * 1e6:19.0f}" if inside[row] else f"{'-':>19}"
        print(f"{row:12} {step * 1e3:15.3f} {step / base:7.2f} {call}")


if __name__ == "__main__":
    main()
