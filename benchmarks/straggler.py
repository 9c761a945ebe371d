"""What ``StragglerDetector`` costs a CPU step of about 5 ms, side by side with the same job without it.

One fit of 2 gloo DDP ranks (Lightning's launcher) trains a small MLP whose step takes about 5 ms (its
width chosen for ``--step-ms`` on this machine, or given by ``--width``). The rows take turns in blocks
of ``--block`` steps within that one fit, so that the machine's drift (other processes, clocks, caches)
falls on every row alike; separate fits differ by more than what is measured here:

- ``without``: the job as it is;
- ``empty callback``: one more ``Callback`` that overrides nothing (what any callback costs in
  Lightning's hook dispatch, every hook of every step);
- ``StragglerDetector()``: its defaults (a window of 100 steps: one 8-number all-gather per window),
  put in at its block's first step (its ``on_train_start``: hooks on, windows afresh) and taken out with
  its ``teardown`` after its block's last.

Columns: the median wall time per step (between consecutive steps' ends, the first ``--skip`` steps of
each block left out) and the median CPU time of the training thread per step (``time.thread_time``: the
forward, backward and optimizer on the CPU, every hook; not the time blocked in a collective, nor other
processes' load, which make wall times on a shared machine vary by more than what is measured here),
each with its ratio to ``without``; the overhead over ``without`` in CPU microseconds per step and as a
share of a 5 ms step. Below the table:
the detector's own work per step (its ``StepTimer`` marks and one window's close per ``window`` steps,
without Lightning's dispatch), timed in a loop. Usage: ``python benchmarks/straggler.py [--steps 9000]
[--block 300] [--step-ms 5] [--width W]``.
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

from lightning_resume import StragglerDetector
from lightning_resume.straggler.step_timer import HostClock, StepTimer

ROWS = ("without", "empty callback", "StragglerDetector()")


class Mlp(pl.LightningModule):
    def __init__(self, steps: int, width: int) -> None:
        super().__init__()
        self.steps = steps
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.net(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.001)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        n = 64 * 2 * self.steps
        data = torch.utils.data.TensorDataset(torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=64)


class Turns(pl.Callback):
    """First in the Trainer's list: at each block's first step, takes the last row's callback out and puts
    the next row's in (every rank at the same step); times every step's end."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.rows: list[pl.Callback | None] = [None, pl.Callback(), StragglerDetector()]
        self.row = 0
        self.ends: list[tuple[int, int, float, float]] = []  # (row, step in its block, wall, CPU)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step % self.block:
            return
        last = self.rows[self.row]
        if last is not None:
            last.teardown(trainer, pl_module, "fit")
            trainer.callbacks = [c for c in trainer.callbacks if c is not last]  # type: ignore[attr-defined]
        self.row = (trainer.global_step // self.block) % len(self.rows)
        now = self.rows[self.row]
        if now is not None:
            trainer.callbacks = [*trainer.callbacks, now]  # type: ignore[attr-defined]
            now.on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        at = (trainer.global_step - 1) % self.block
        self.ends.append((self.row, at, time.perf_counter(), time.thread_time()))


def width_for(step_ms: float, width: int = 256) -> int:
    """The MLP width whose step (forward, backward, SGD; one process) takes about ``step_ms`` here."""
    model = Mlp(1, width)
    optimizer = model.configure_optimizers()
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    times = []
    for _ in range(60):
        start = time.perf_counter()
        optimizer.zero_grad()
        model.training_step((x, y), 0).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    measured = statistics.median(times[10:]) * 1e3
    return max(16, round(width * (step_ms / measured) ** 0.5))  # the width x width layer dominates


def own_work(window: int, steps: int = 20_000) -> float:
    """Seconds per step of the detector's own marks (``StepTimer``), its window closes included."""
    timer = StepTimer(HostClock())
    start = time.perf_counter()
    for step in range(1, steps + 1):
        timer.start()
        timer.grad_ready()
        timer.grad_ready()
        timer.backward_done()
        timer.optimizer_start()
        timer.optimizer_done()
        timer.end()
        if step % window == 0:
            timer.close()
    return (time.perf_counter() - start) / steps


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=9000, help="training steps in all")
    parser.add_argument("--block", type=int, default=300, help="steps per turn of a row")
    parser.add_argument("--skip", type=int, default=20, help="steps left out at the start of each turn")
    parser.add_argument("--step-ms", type=float, default=5.0, help="the step time to choose the width for")
    parser.add_argument("--width", type=int, help="the MLP's width (default: chosen for --step-ms)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # two ranks on the machine's cores, each on one
    # Chosen once, by the launching process: the rank it starts inherits it through the environment.
    width = args.width or int(os.environ.setdefault("STRAGGLER_BENCH_WIDTH", str(width_for(args.step_ms))))
    turns = Turns(args.block)
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
        callbacks=[turns],
    )
    trainer.fit(Mlp(args.steps, width))
    if trainer.global_rank != 0:
        return
    wall: list[list[float]] = [[] for _ in ROWS]
    cpu: list[list[float]] = [[] for _ in ROWS]
    for (row, at, end, used), (_, _, before, used_before) in zip(
        turns.ends[1:], turns.ends[:-1], strict=True
    ):
        if at >= args.skip:
            wall[row].append(end - before)
            cpu[row].append(used - used_before)
    walls = [statistics.median(times) for times in wall]
    cpus = [statistics.median(times) for times in cpu]
    print(
        f"2 gloo ranks, {args.steps} steps in turns of {args.block} ({len(wall[0])} timed per row), "
        f"width {width}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    columns = ("wall ms", "x without", "CPU ms", "x without", "CPU us", "of 5 ms")
    print(f"{'row (median per step)':22} " + " ".join(f"{c:>9}" for c in columns))
    for row, name in enumerate(ROWS):
        extra = cpus[row] - cpus[0]
        print(
            f"{name:22} {walls[row] * 1e3:9.3f} {walls[row] / walls[0]:9.4f} {cpus[row] * 1e3:9.3f} "
            f"{cpus[row] / cpus[0]:9.4f} {extra * 1e6:9.1f} {extra / 0.005:9.2%}"
        )
    window = StragglerDetector().window
    own = own_work(window) * 1e6
    print(f"StragglerDetector's own marks, one window closed per {window} steps: {own:.2f} us/step")


if __name__ == "__main__":
    main()
