"""What the resume's self-check costs: per save, per first step after a save, and per ordinary step.

Prints one table measured side by side in one run, for a small model and a 25M-parameter one (Adam,
a 64x3x224x224 batch): the fingerprint each checkpoint carries, the fingerprint of the first step
after a save (with its batch), what that step produced (a digest of every parameter and buffer, and
its loss), the record's file (written as that step ends, once per save), ``ExactResume``'s
``on_train_batch_start`` and ``on_train_batch_end`` on an ordinary step (Lightning's SimpleProfiler,
a real Trainer), each against a 5 ms step, against ``torch.save`` of the same checkpoint into memory,
and against the memory-copy floor (``clone`` of every tensor of that state).

    python benchmarks/self_check.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume.exact_resume import self_check

STEP = 0.005  # the step the target is stated against


class Model(pl.LightningModule):
    def __init__(self, width: int, depth: int, inputs: int) -> None:
        super().__init__()
        self.inputs = inputs
        layers: list[nn.Module] = [nn.Linear(inputs, width)]
        layers += [nn.Linear(width, width) for _ in range(depth)]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x.reshape(len(x), -1)[:, : self.inputs]), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def median(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trainer(root: Path, steps: int, **options: Any) -> pl.Trainer:
    return pl.Trainer(
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=root,
        **options,
    )


def measure(name: str, width: int, depth: int, repeats: int, root: Path) -> list[str]:
    images = torch.randn(64, 3, 224, 224)
    batch = (images, torch.randn(64, 1))
    model = Model(width, depth, inputs=1024)
    # One step, so that Adam has its state and the Trainer its optimizers.
    fit = trainer(root / name, 1)
    loader = DataLoader(TensorDataset(images[:8], batch[1][:8]), batch_size=8)
    fit.fit(model, loader)
    checkpoint = {"state_dict": model.state_dict(), "optimizer": fit.optimizers[0].state_dict()}
    tensors = [*model.state_dict().values()] + [
        v for s in fit.optimizers[0].state_dict()["state"].values() for v in s.values() if torch.is_tensor(v)
    ]
    folder = root / name / "fingerprints"

    def at_save() -> object:
        return self_check.take(fit, 3, False)

    def next_step() -> object:
        return self_check.take(fit, 4, False, batch)

    def outcome() -> object:
        return self_check.outcome(model, torch.tensor(0.5))

    def its_file() -> None:
        self_check.write_next(folder, 0, [3, 3], fingerprint)

    fingerprint = {**next_step(), "outcome": outcome()}

    def save() -> None:
        torch.save(checkpoint, io.BytesIO())

    def floor() -> None:
        for t in tensors:
            t.clone()

    # ExactResume's hook on ordinary steps: a real Trainer, profiled by Lightning.
    profiled = trainer(
        root / name / "run",
        200,
        profiler="simple",
        callbacks=[RunDir(root=root / name / "runs"), RequeueCheckpoint(save_on_train_epoch_end=False)],
    )
    small = DataLoader(TensorDataset(torch.randn(64, 1024), torch.randn(64, 1)), batch_size=8)
    profiled.fit(Model(64, 1, inputs=1024), small)
    durations = profiled.profiler.recorded_durations  # type: ignore[attr-defined]
    hooks = [f"[Callback]ExactResume.on_train_batch_{when}" for when in ("start", "end")]
    per_step = sum(statistics.median(durations[hook]) for hook in hooks)

    rows = []
    saved, copied = median(save, max(3, repeats // 4)), median(floor, max(3, repeats // 4))
    params = sum(p.numel() for p in model.parameters())
    for what, seconds in (
        ("fingerprint in each checkpoint", median(at_save, repeats)),
        ("first step after a save (with the batch)", median(next_step, repeats)),
        ("  what it produced (parameters, buffers, loss)", median(outcome, repeats)),
        ("  its file (as it ends)", median(its_file, repeats)),
        ("ExactResume hooks, ordinary step", per_step),
    ):
        rows.append(
            f"| {name} ({params / 1e6:.1f}M) | {what} | {seconds * 1e6:9.0f} us | {seconds / STEP:6.3f} "
            f"| {seconds / saved:6.4f} | {seconds / copied:6.4f} |"
        )
    rows.append(
        f"| {name} ({params / 1e6:.1f}M) | (torch.save to memory / clone floor) | {saved * 1e6:9.0f} us "
        f"| {saved / STEP:6.3f} | 1 | {saved / copied:6.2f} |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning_resume").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    print("| model | what | median | / 5 ms step | / torch.save | / clone floor |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, width, depth in (("small", 64, 1), ("25M", 1024, 22)):
            for row in measure(name, width, depth, args.repeats, Path(tmp)):
                print(row, flush=True)


if __name__ == "__main__":
    main()
