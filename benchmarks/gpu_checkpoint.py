"""The GPU numbers, on one CUDA device, unattended: ``python benchmarks/gpu_checkpoint.py``.

1. **Stall of an asynchronous save of CUDA tensors.** ``DurableCheckpointIO`` stages device tensors
   through its shared host buffer, page-locked (pinned) once and reused: one asynchronous copy per
   storage, one synchronisation per stream. Against the device-to-pinned copy floor (every tensor copied
   into a preallocated pinned buffer, then one synchronisation), quiet and beside ``--load`` busy
   processes: ``checkpoint_io.py --only stall`` on the device, a model + Adam state of ``--sizes`` MB.
2. **The per-step agreement of ``PreemptionHandler`` on real GPU steps.** One process, Lightning's
   ``DDPStrategy(process_group_backend="nccl")``, an MLP of ``--width`` x ``--depth``: the step time
   without the handler, with its agreement every step (the default) and every 10th step. The package
   skips the collective at world size 1 (there is nothing to agree on); here it runs anyway, as it does on
   several ranks (an NCCL all-reduce, and the wait for the device that reading its result implies).
   Rows take turns over ``--rounds`` rounds, each in a fresh process.

``--device cpu`` runs the same on the CPU (gloo), to check the script where no GPU is. The correctness
side (NCCL collectives, SIGTERM stop, exact resume with the CUDA random states) is ``make test-gpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import checkpoint_io

AGREEMENT = {"none": 0, "every step": 1, "every 10th": 10}


def stall_tables(sizes: list[int], load: int, saves: int, repeats: int) -> None:
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    rows = ["copy floor", "ours async"]
    for size in sizes:
        for level in [0] + ([load] if load else []):
            with checkpoint_io.busy_processes(level):
                for repeat in range(repeats):
                    print(
                        f"stalls at {size} MB, load {level}, run {repeat + 1} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    result = checkpoint_io.run_child(
                        ",".join(rows), size, saves, 0, None, False, stalls_only=True
                    )
                    runs.setdefault((size, level), []).append(result)
    checkpoint_io.report_stalls(runs, rows)


def agreement_child(row: str, device: str, steps: int, width: int, depth: int) -> dict[str, Any]:
    """One fit of ``steps`` steps with the agreement of ``row``; the mean step time after a warm-up."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DDPStrategy, ParallelStrategy
    from torch import nn

    from lightning_resume import PreemptionHandler, RequeueCheckpoint, RunDir, _collectives

    # As on several ranks: the agreement reaches the backend (see the module docstring).
    def initialised(strategy: Any) -> bool:
        return isinstance(strategy, ParallelStrategy) and torch.distributed.is_initialized()

    _collectives._distributed = initialised
    warm = min(20, steps // 4)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.start = self.end = 0.0

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == warm:
                self._sync(trainer)
                self.start = time.perf_counter()

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._sync(trainer)
            self.end = time.perf_counter()

        @staticmethod
        def _sync(trainer: pl.Trainer) -> None:
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize(trainer.strategy.root_device)

    root = tempfile.mkdtemp(prefix="gpu-bench-")
    clock = Clock()
    callbacks: list[pl.Callback] = [
        clock,
        RequeueCheckpoint(every_n_train_steps=None, save_on_train_epoch_end=False),
        RunDir(root=root),
    ]
    if AGREEMENT[row]:
        callbacks.append(PreemptionHandler(requeue=False, check_every_n_steps=AGREEMENT[row]))
    batch = torch.randn(256, width)
    data = torch.utils.data.TensorDataset(batch.repeat(4, 1))
    trainer = pl.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        strategy=DDPStrategy(process_group_backend="nccl" if device == "cuda" else "gloo"),
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    try:
        trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=256))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"step": (clock.end - clock.start) / (steps - warm), "device": str(trainer.strategy.root_device)}


def agreement_table(device: str, steps: int, rounds: int, width: int, depth: int) -> None:
    times: dict[str, list[float]] = {row: [] for row in AGREEMENT}
    where = ""
    for round_ in range(rounds):
        for row in AGREEMENT:
            print(f"agreement {row!r}, round {round_ + 1} ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--agreement-child", row, "--device", device]
            cmd += ["--steps", str(steps), "--width", str(width), "--depth", str(depth)]
            env = {**os.environ, "PYTHONWARNINGS": "ignore"}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                raise RuntimeError(f"agreement row {row!r} failed:\n{out.stdout}\n{out.stderr}")
            result = json.loads(lines[-1][len("RESULT ") :])
            times[row].append(result["step"])
            where = result["device"]
    base = statistics.median(times["none"])
    print(f"\n### Per-step agreement ({where}, MLP {width} x {depth}, {steps} steps x {rounds} rounds)\n")
    print("| agreement | median step ms | x none |\n|---|---|---|")
    for row in AGREEMENT:
        step = statistics.median(times[row])
        print(f"| {row} | {step * 1e3:.3f} | {step / base:.3f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--sizes", default="1024,4096", help="state sizes in MB for the stall, comma-separated"
    )
    parser.add_argument(
        "--load", type=int, default=2, help="busy processes in the loaded stall runs (0: none)"
    )
    parser.add_argument("--saves", type=int, default=5, help="measured saves per row and process")
    parser.add_argument("--repeats", type=int, default=3, help="stall processes per size and load")
    parser.add_argument("--steps", type=int, default=300, help="training steps per agreement run")
    parser.add_argument("--rounds", type=int, default=3, help="agreement rounds (rows take turns)")
    parser.add_argument(
        "--width", type=int, default=None, help="MLP width (default 4096 on CUDA, 128 on CPU)"
    )
    parser.add_argument("--depth", type=int, default=8, help="MLP depth")
    parser.add_argument("--only", choices=["stall", "agreement"], default=None)
    parser.add_argument("--agreement-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    width = args.width or (4096 if args.device == "cuda" else 128)
    if args.agreement_child is not None:
        result = agreement_child(args.agreement_child, args.device, args.steps, width, args.depth)
        print("RESULT " + json.dumps(result), flush=True)
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("No CUDA device: run with --device cpu to check the script, or on a machine with a GPU.")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the stall children pick the device themselves
    if args.only in (None, "stall"):
        stall_tables([int(s) for s in args.sizes.split(",")], args.load, args.saves, args.repeats)
    if args.only in (None, "agreement"):
        agreement_table(args.device, args.steps, args.rounds, width, args.depth)


if __name__ == "__main__":
    main()
