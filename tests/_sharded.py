"""A one-process strategy that saves checkpoints as directories, as sharded strategies do.

``ModelParallelStrategy`` needs a process group (tests/jobs/sharded_job.py runs it in subprocesses).
This strategy writes ``trainer.save_checkpoint(path)`` as a directory of files without calling any
``CheckpointIO`` and loads it back in ``load_checkpoint``, which is all ``RequeueCheckpoint`` sees of
a sharded strategy; so the callback's directory path runs in-process, in a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume.run_dir.binding import PROCESS

SHARD = "__0_0.distcp"
META = "meta.pt"


class DirectoryStrategy(SingleDeviceStrategy):
    """Saves ``state_dict`` as ``__0_0.distcp`` and the rest as ``meta.pt`` in a directory.

    Args:
        fail_at_save: Raise ``OSError`` at this save (counted from 1) instead of writing it.
    """

    def __init__(self, fail_at_save: int | None = None) -> None:
        super().__init__(device=torch.device("cpu"))
        self.fail_at_save = fail_at_save
        self.saves = 0
        self.loaded: list[str] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self.saves += 1
        path = Path(filepath)
        path.mkdir(parents=True, exist_ok=True)
        if self.saves == self.fail_at_save:
            raise OSError(28, "No space left on device", str(path / SHARD))
        torch.save(checkpoint.pop("state_dict"), path / SHARD)
        torch.save(checkpoint, path / META)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        self.loaded.append(str(checkpoint_path))
        path = Path(checkpoint_path)
        checkpoint: dict[str, Any] = torch.load(path / META, weights_only=False)
        checkpoint["state_dict"] = torch.load(path / SHARD, weights_only=True)
        return checkpoint


class FirstStep(pl.Callback):
    """Records the global step training starts at (greater than 0 when resumed)."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step


def fit_directories(
    tmp_path: Path, steps: int, key: str = "k", strategy: DirectoryStrategy | None = None, **fit: Any
) -> tuple[RunDir, FirstStep, DirectoryStrategy]:
    """A new process's fit of session ``key`` with ``RequeueCheckpoint`` saving every step as a directory."""
    PROCESS.reset()
    run_dir, first = RunDir(root=tmp_path / "root", key=key), FirstStep()
    strategy = strategy or DirectoryStrategy()
    callbacks = (run_dir, RequeueCheckpoint(every_n_train_steps=1), first)
    trainer = tiny_trainer(*callbacks, tmp_path=tmp_path, strategy=strategy, max_steps=steps, max_epochs=3)
    trainer.fit(BoringModel(), **fit)
    return run_dir, first, strategy
