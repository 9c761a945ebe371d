"""Pins the Lightning internals lightning_resume touches; fails loudly when Lightning changes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader

from lightning_resume._resume.lightning_internals import (
    capture_checkpoint,
    restart_train_iterator,
    saves_directory,
)
from lightning_resume.io._redirect_first_strategy_load import RedirectFirstStrategyLoad


class Recorder(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.arange(6, dtype=torch.float32).unsqueeze(1).repeat(1, 32), batch_size=1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen.append(int(batch[0, 0]))
        return super().training_step(batch, batch_idx)


def test_restart_train_iterator_rebuilds_the_iterator_training_uses(tmp_path: Path) -> None:
    class Reverse(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            trainer.train_dataloader.batch_sampler.sampler = list(reversed(range(6)))
            restart_train_iterator(trainer)

    model = Recorder()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[Reverse()],
    )
    trainer.fit(model)
    assert model.seen == [5, 4, 3, 2, 1, 0]


def test_saves_directory_reads_the_strategies_own_settings() -> None:
    from lightning.pytorch.strategies import (
        DDPStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    class Custom(SingleDeviceStrategy):
        def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any = None) -> None:
            super().save_checkpoint(checkpoint, filepath, storage_options)

    assert saves_directory(ModelParallelStrategy()) is True
    assert saves_directory(ModelParallelStrategy(save_distributed_checkpoint=False)) is False
    assert saves_directory(FSDPStrategy(state_dict_type="sharded")) is True
    assert saves_directory(FSDPStrategy()) is False  # "full": one file through checkpoint_io
    assert saves_directory(DDPStrategy()) is False
    assert saves_directory(SingleDeviceStrategy("cpu")) is False
    assert saves_directory(Custom("cpu")) is None


def tiny_fit(tmp_path: Path, steps: int, **fit: Any) -> pl.Trainer:
    trainer = pl.Trainer(
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel(), **fit)
    return trainer


def test_capture_checkpoint_returns_what_the_strategy_would_write_and_writes_nothing(tmp_path: Path) -> None:
    trainer = tiny_fit(tmp_path, 2)
    checkpoint = capture_checkpoint(trainer, tmp_path / "never")
    assert checkpoint["global_step"] == 2 and "state_dict" in checkpoint and "optimizer_states" in checkpoint
    assert not (tmp_path / "never").exists()
    assert "save_checkpoint" not in trainer.strategy.__dict__  # the method is the class's again
    trainer.save_checkpoint(tmp_path / "real.ckpt")
    assert (tmp_path / "real.ckpt").is_file()


def test_lightning_loads_a_resumed_checkpoint_through_one_strategy_load_call(tmp_path: Path) -> None:
    # The seam of RedirectFirstStrategyLoad: fit(ckpt_path=...) calls strategy.load_checkpoint once.
    trainer = tiny_fit(tmp_path, 2)
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    trainer = tiny_fit(tmp_path, 4)
    trainer.save_checkpoint(tmp_path / "four.ckpt")
    redirected: list[str] = []

    class Install(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            redirect = RedirectFirstStrategyLoad(
                trainer.strategy, str(tmp_path / "four.ckpt"), redirected.append, 1, 1
            )
            redirect.install()

    again = pl.Trainer(
        max_steps=5,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[Install()],
    )
    again.fit(BoringModel(), ckpt_path=tmp_path / "two.ckpt")
    assert redirected == [str(tmp_path / "two.ckpt")]
    assert again.global_step == 5  # resumed at 4, not 2
    assert "load_checkpoint" not in again.strategy.__dict__
