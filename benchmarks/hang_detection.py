"""How fast a hung rank becomes a restarted job with ``ProgressWatchdog``, and what watching costs per step.

**Detection.** 2 gloo ranks under ``torchrun --max-restarts=1``, a tiny model with a short step,
``last.ckpt`` every 2 steps; on the first attempt rank 1 blocks forever at step ``--hang-at`` and rank
0 waits for it in the step's all-reduce. Rows, one launch each:

- ``ProgressWatchdog``: every rank's watchdog fires after ``--floor`` seconds without progress (its
  learned step timeout: ``min_timeout``, the floor), writes its stacks and exits; torchrun restarts.
- ``gloo's timeout``: no watchdog, ``DDPStrategy(timeout=--gloo-timeout)``: rank 0's all-reduce fails
  after that timeout, its exception ends it, and torchrun stops rank 1 and restarts.

Columns: the timeout in effect; from the hang to every rank of the first attempt exited (each rank's
pid polled every 10 ms); from the hang to the end of the first resumed step; and the first column at the
defaults, which the detection shifts by the timeout alone: ``ProgressWatchdog``'s floor of 300 s,
Lightning's process-group timeout of 1800 s for gloo (and NCCL, whose own default in torch is 600 s;
NCCL is not measured here: no GPU).

**Cost.** One process, a tiny model whose step sleeps 5 ms, ``--steps`` steps per row, rows interleaved
over ``--rounds``: no callback, ``RunDir`` (it records the attempt), ``RunDir`` + ``ProgressWatchdog``.
Columns: the median step time (between consecutive batch ends), its spread (interquartile range, the
noise), the difference with the first row, and the time inside the watchdog's hooks per step.

Usage: ``python benchmarks/hang_detection.py [--floor 30] [--gloo-timeout 30] [--steps 400] [--rounds 3]``
(``--skip-detection`` / ``--skip-cost`` run one part).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from lightning_resume import ProgressWatchdog, RequeueCheckpoint, RunDir, WatchdogTimeouts

#: The defaults the detection rows are extrapolated to.
WATCHDOG_FLOOR = 300.0
LIGHTNING_PG_TIMEOUT = 1800.0
NCCL_TORCH_DEFAULT = 600.0


class Tiny(pl.LightningModule):
    def __init__(self, steps: int, sleep: float) -> None:
        super().__init__()
        self.steps, self.sleep = steps, sleep
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.sleep:
            time.sleep(self.sleep)  # the toy step's "compute"
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        n = 8 * 2 * self.steps
        data = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=8)


# -- detection: the worker (run by torchrun) -----------------------------------------------------------


class Marks(pl.Callback):
    """Writes the pid, the hang time (rank 1 blocks there, first attempt) and the first step's end."""

    def __init__(self, folder: Path, hang_at: int) -> None:
        self.folder, self.hang_at = folder, hang_at
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.first = True

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        (self.folder / f"pid-{self.attempt}-{trainer.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.attempt == 0 and trainer.global_rank == 1 and trainer.global_step == self.hang_at:
            (self.folder / "hang").write_text(repr(time.time()))
            threading.Event().wait()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.first and trainer.global_rank == 0:
            (self.folder / f"first-{self.attempt}").write_text(repr(time.time()))
        self.first = False


def worker(args: argparse.Namespace) -> None:
    folder = Path(args.folder)
    callbacks: list[pl.Callback] = [Marks(folder, args.hang_at), RunDir(root=folder / "runs")]
    callbacks.append(RequeueCheckpoint(every_n_train_steps=2))
    if args.watchdog:
        timeouts = WatchdogTimeouts(minimum=args.floor, first_step=600)
        callbacks.append(ProgressWatchdog(timeouts=timeouts))
    strategy = DDPStrategy(timeout=timedelta(seconds=args.gloo_timeout)) if not args.watchdog else "ddp"
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=args.hang_at + 10,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )
    trainer.fit(Tiny(args.hang_at + 10, 0.02))


# -- detection: the launcher ---------------------------------------------------------------------------


def _read_time(path: Path, timeout: float, proc: subprocess.Popen[bytes]) -> float:
    """The time written to ``path``, once it is (the job must still run)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return float(path.read_text())
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    log = (path.parent / "log").read_text()[-3000:]
    raise RuntimeError(f"{path.name} was not written (job status {proc.poll()}):\n{log}")


def _all_exited(pids: list[int], timeout: float) -> float:
    """Wall time when the last of ``pids`` exited."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return time.time()
        time.sleep(0.01)
    raise TimeoutError(f"ranks {pids} still alive after {timeout:.0f} s")


def detect(watchdog: bool, args: argparse.Namespace) -> tuple[float, float]:
    """One launch: (hang to every rank exited, hang to the first resumed step's end), in seconds."""
    with tempfile.TemporaryDirectory(prefix="hang-detection-") as tmp:
        folder = Path(tmp)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        command += ["--max-restarts", "1", os.path.abspath(__file__), "--worker", "--folder", str(folder)]
        command += ["--hang-at", str(args.hang_at), "--floor", str(args.floor)]
        command += ["--gloo-timeout", str(args.gloo_timeout)] + (["--watchdog"] if watchdog else [])
        env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONWARNINGS": "ignore"}
        limit = 600 + args.floor + args.gloo_timeout
        with open(folder / "log", "w") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                hang = _read_time(folder / "hang", limit, proc)
                pids = [int(_read_time(folder / f"pid-0-{rank}", 10, proc)) for rank in (0, 1)]
                exited = _all_exited(pids, limit)
                resumed = _read_time(folder / "first-1", limit, proc)
                if proc.wait(timeout=limit) != 0:
                    raise RuntimeError(f"the job failed: {(folder / 'log').read_text()[-3000:]}")
            finally:
                if proc.poll() is None:
                    proc.kill()
        return exited - hang, resumed - hang


# -- cost ----------------------------------------------------------------------------------------------


class Clock(pl.Callback):
    """Every batch's end time; a second clock (``partner``) times the callbacks between the two."""

    def __init__(self, partner: Clock | None = None) -> None:
        self.ends: list[float] = []
        self.partner = partner
        self.starts: list[float] = []
        self.inside: list[float] = []

    def _mark(self, *args: Any) -> None:
        now = time.perf_counter()
        if self.partner is None:
            self.starts.append(now)
        else:
            self.partner.inside.append(now - self.partner.starts[-1])

    on_train_batch_start = _mark

    def on_train_batch_end(self, *args: Any) -> None:
        self._mark()
        if self.partner is None:
            self.ends.append(time.perf_counter())


def cost_round(row: str, steps: int, folder: Path) -> tuple[list[float], list[float]]:
    """Step times of one fit (seconds), and the time inside the callbacks between the clocks per step."""
    before = Clock()
    after = Clock(before)
    middle: list[pl.Callback] = []
    if row != "no callback":
        middle.append(RunDir(root=folder / "runs"))
    if row == "RunDir + ProgressWatchdog":
        middle.append(ProgressWatchdog())
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        callbacks=[before, *middle, after],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=folder,
    )
    trainer.fit(Tiny(steps, 0.005))
    ends = before.ends[10:]  # after warm-up
    # Two marks per step (batch start and end): the hooks' time per step is their sum.
    inside = [a + b for a, b in zip(before.inside[20::2], before.inside[21::2], strict=False)]
    return [b - a for a, b in itertools.pairwise(ends)], inside


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--floor", type=float, default=30.0, help="WatchdogTimeouts(minimum=...), seconds")
    parser.add_argument("--gloo-timeout", type=float, default=30.0, help="DDPStrategy(timeout=...), seconds")
    parser.add_argument("--hang-at", type=int, default=12, help="the step rank 1 hangs at")
    parser.add_argument("--steps", type=int, default=400, help="training steps per cost row and round")
    parser.add_argument("--rounds", type=int, default=3, help="cost rounds; rows are interleaved within each")
    parser.add_argument("--skip-detection", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--watchdog", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.skip_detection:
        print("2 gloo ranks under torchrun --max-restarts=1; rank 1 hangs, rank 0 waits in the all-reduce")
        print("| row | timeout | hang -> all ranks exited | hang -> first resumed step | at the defaults |")
        print("| --- | --- | --- | --- | --- |")
        exited, resumed = detect(True, args)
        default = WATCHDOG_FLOOR + exited - args.floor
        print(
            f"| ProgressWatchdog (minimum={args.floor:.0f}) | {args.floor:.0f} s | {exited:.1f} s | "
            f"{resumed:.1f} s | {default:.0f} s (floor 300 s) |"
        )
        exited, resumed = detect(False, args)
        default = LIGHTNING_PG_TIMEOUT + exited - args.gloo_timeout
        print(
            f"| gloo's timeout alone (DDPStrategy(timeout={args.gloo_timeout:.0f} s)) | "
            f"{args.gloo_timeout:.0f} s | {exited:.1f} s | {resumed:.1f} s | "
            f"{default:.0f} s (Lightning's 1800 s) |"
        )
        print(
            f"| NCCL (not measured: no GPU) | {NCCL_TORCH_DEFAULT:.0f} s torch, {LIGHTNING_PG_TIMEOUT:.0f} s "
            "Lightning | | | at least the timeout; its abort may never come (pytorch#97191) |"
        )
    if not args.skip_cost:
        rows = ["no callback", "RunDir", "RunDir + ProgressWatchdog"]
        steps: dict[str, list[float]] = {row: [] for row in rows}
        inside: dict[str, list[float]] = {row: [] for row in rows}
        with tempfile.TemporaryDirectory(prefix="hang-detection-cost-") as tmp:
            for round_ in range(args.rounds):
                for row in rows:
                    times, hooks = cost_round(row, args.steps, Path(tmp) / f"{round_}-{row}")
                    steps[row] += times
                    inside[row] += hooks
        print(f"\n1 process, a 5 ms toy step, {args.steps} steps x {args.rounds} rounds per row")
        print("| row | median step | spread (IQR) | vs no callback | inside the callbacks per step |")
        print("| --- | --- | --- | --- | --- |")
        base = statistics.median(steps["no callback"])
        for row in rows:
            q1, median, q3 = _quartiles(steps[row])
            hooks = statistics.median(inside[row]) if inside[row] else 0.0
            spread, diff = (q3 - q1) * 1e3, (median - base) * 1e3
            print(
                f"| {row} | {median * 1e3:.3f} ms | {spread:.3f} ms | {diff:+.3f} ms | {hooks * 1e6:.1f} us |"
            )


if __name__ == "__main__":
    main()
