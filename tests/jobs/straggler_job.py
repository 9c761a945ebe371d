"""A DDP job on CPU ranks (gloo) with ``StragglerDetector`` and stragglers made to order.

``--slow-backward RANK:SECONDS[:FROM[:TO]]`` adds SECONDS to the backward of each step of global rank
RANK from step FROM (default 0) to step TO (excluded); ``--slow-data`` the same to the loading of each
batch. Each straggler named is written as a JSON line to ``--out`` (through ``on_straggler``), each
window's times too when ``--windows-out`` is given. ``--root`` adds ``RunDir`` (and, with ``--every``,
``RequeueCheckpoint``); ``--kill-at STEP`` SIGKILLs every rank there. ``--one-per-node``: this process
is one rank of ``--devices``, started by the caller as a node of one device (``tests/gpu``: two ranks on
one GPU, gloo; ``NODE_RANK`` and ``LOCAL_RANK=0`` set); ``--gpu-sleep`` keeps the GPU busy in the
backward while the host runs on. Test-only scaffolding.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

from lightning_resume import RequeueCheckpoint, RunDir, Straggler, StragglerDetector

#: What the data loader and the backward need to know (set by the model, read in this process).
NOW = {"rank": 0, "step": 0}


@dataclass(frozen=True)
class Slowdown:
    rank: int
    seconds: float
    start: int = 0
    stop: int = 1 << 30
    on_gpu: bool = False

    @classmethod
    def parse(cls, text: str) -> Slowdown:
        rank, seconds, *span = text.split(":")
        return cls(int(rank), float(seconds), *map(int, span))

    def sleep(self) -> None:
        if NOW["rank"] != self.rank or not self.start <= NOW["step"] < self.stop:
            return
        if self.on_gpu:
            torch.cuda._sleep(int(self.seconds * CYCLES_PER_SECOND[0]))  # the GPU waits, not the host
        else:
            time.sleep(self.seconds)


#: The GPU's clock cycles per second, for ``torch.cuda._sleep`` (measured once, with CUDA events).
CYCLES_PER_SECOND = [0.0]


def calibrate() -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(200_000_000)
    end.record()
    end.synchronize()
    CYCLES_PER_SECOND[0] = 200_000_000 / (start.elapsed_time(end) / 1000)


class SlowBackward(torch.autograd.Function):
    """Identity, with the slowdowns slept at the start of the backward (before any parameter gradient)."""

    slowdowns: list[Slowdown] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        for slowdown in SlowBackward.slowdowns:
            slowdown.sleep()
        return grad


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))

    def setup(self, stage: str) -> None:
        NOW["rank"] = self.global_rank

    def on_train_start(self) -> None:
        if self.device.type == "cuda":
            calibrate()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        NOW["step"] = self.trainer.global_step
        return SlowBackward.apply(self.layers(batch).pow(2).mean())

    def on_train_batch_end(self, *args: Any) -> None:
        NOW["step"] = self.trainer.global_step  # the loading of the next batch follows

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Random(Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(32, generator=torch.Generator().manual_seed(index))


class SlowCollate:
    def __init__(self, slowdowns: list[Slowdown]) -> None:
        self.slowdowns = slowdowns

    def __call__(self, items: list[torch.Tensor]) -> torch.Tensor:
        for slowdown in self.slowdowns:
            slowdown.sleep()
        return torch.stack(items)


class KillAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.killpg(os.getpgrp(), signal.SIGKILL)


class Windows(pl.Callback):
    """Write the detector's summary as rank 0 has it after each window (read as the next step starts, or
    as training ends: the detector is the last callback to see a step's end)."""

    def __init__(self, path: str, detector: StragglerDetector) -> None:
        self.path, self.detector, self.seen = path, detector, 0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        summary = self.detector.summary()
        if trainer.is_global_zero and summary["windows"] > self.seen:
            self.seen = summary["windows"]
            _append(self.path, json.dumps({"step": trainer.global_step, **summary}) + "\n")

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.on_train_batch_start(trainer)


def exclude_node(straggler: Straggler) -> None:
    """What a user may hand to ``on_straggler`` (``tests/test_cli_yaml.py`` builds it from YAML)."""
    _append("exclude_nodes.txt", straggler.host + "\n")


def _append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--out", required=True)
    p.add_argument("--windows-out")
    p.add_argument("--window", type=int)
    p.add_argument("--patience", type=int)
    p.add_argument("--threshold", type=float)
    p.add_argument("--floor-ms", type=float)
    p.add_argument("--slow-backward", type=Slowdown.parse, action="append", default=[])
    p.add_argument("--slow-data", type=Slowdown.parse, action="append", default=[])
    p.add_argument("--gpu-sleep", type=Slowdown.parse, action="append", default=[])
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--one-per-node", action="store_true", help="a rank started by the caller, on device 0")
    p.add_argument("--host-clock", action="store_true", help="time on the host even on CUDA (a control)")
    p.add_argument("--root")
    p.add_argument("--every", type=int)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--validate-every", type=int)
    p.add_argument("--without", action="store_true", help="no StragglerDetector (the same job without it)")
    args = p.parse_args()
    if args.host_clock:
        from lightning_resume.straggler import straggler_detector
        from lightning_resume.straggler.step_timer import HostClock

        straggler_detector.CudaClock = lambda device: HostClock()  # type: ignore[assignment,misc]

    def named(straggler: Straggler) -> None:
        _append(args.out, json.dumps(straggler.to_dict()) + "\n")

    knobs = {k: getattr(args, k) for k in ("window", "patience", "threshold", "floor_ms")}
    detector = StragglerDetector(**{k: v for k, v in knobs.items() if v is not None}, on_straggler=named)
    callbacks: list[pl.Callback] = [] if args.without else [detector]
    if args.windows_out and not args.without:
        callbacks.append(Windows(args.windows_out, detector))
    if args.root:
        callbacks.append(RunDir(root=args.root))
    if args.every:
        callbacks.append(RequeueCheckpoint(every_n_train_steps=args.every))
    if args.kill_at is not None:
        callbacks.append(KillAt(args.kill_at))
    gpu = [Slowdown(s.rank, s.seconds, s.start, s.stop, on_gpu=True) for s in args.gpu_sleep]
    SlowBackward.slowdowns = [*args.slow_backward, *gpu]
    data = DataLoader(Random(), batch_size=args.batch, collate_fn=SlowCollate(args.slow_data))
    val = DataLoader(Random(), batch_size=args.batch) if args.validate_every else None
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1 if args.one_per_node else args.devices,
        num_nodes=args.devices if args.one_per_node else 1,
        strategy=DDPStrategy(process_group_backend="gloo") if args.devices > 1 else "auto",
        max_steps=args.steps,
        limit_val_batches=2 if val is not None else 0,
        val_check_interval=args.validate_every,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.every),
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(Model(), data, val)
    if trainer.is_global_zero:
        print(f"DONE step={trainer.global_step} named={len(detector.stragglers)}", flush=True)


if __name__ == "__main__":
    main()
