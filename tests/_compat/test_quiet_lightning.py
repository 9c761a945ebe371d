"""Lightning's "dataloader is not resumable" warning: silenced only where RequeueCheckpoint puts the
loader back at its batch, given where it cannot."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader, IterableDataset

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume.run_dir.binding import PROCESS

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared

NOT_RESUMABLE = "your dataloader is not resumable"


class SizedStream(IterableDataset):  # type: ignore[type-arg]
    """An IterableDataset without state (Lightning counts its batches through ``__len__``)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.ones(16, 32))

    def __len__(self) -> int:
        return 16


class StreamModel(BoringModel):
    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return DataLoader(SizedStream(), batch_size=2)


class OwnBatches:
    """A batch sampler without ``sampler``/``batch_size``: nothing to skip through."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([[i, i + 1] for i in range(0, 64, 2)])

    def __len__(self) -> int:
        return 32


class OwnBatchesModel(BoringModel):
    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return DataLoader(RandomDataset(32, 64), batch_sampler=OwnBatches())  # type: ignore[arg-type]


def lightning_warnings_of_restart(tmp_path: Path, model: type[BoringModel]) -> list[str]:
    """Fit 2 steps, then restart mid-epoch (as a requeued job would) to step 3; the restart's warnings."""
    for steps in (2, 3):
        PROCESS.reset()  # a new process, as a restart would be
        run_dir = RunDir(root=tmp_path / "root", key="quiet")
        trainer = tiny_trainer(
            run_dir,
            RequeueCheckpoint(every_n_train_steps=1, save_on_train_epoch_end=False),
            tmp_path=tmp_path,
            max_steps=steps,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(model())
    assert trainer.global_step == 3 and run_dir.is_resumed
    return [str(w.message) for w in caught]


def test_a_mid_epoch_restart_with_a_plain_loader_gives_no_false_warning(tmp_path: Path) -> None:
    assert not [m for m in lightning_warnings_of_restart(tmp_path, BoringModel) if NOT_RESUMABLE in m]


def test_an_iterable_dataset_drawn_again_gives_no_false_warning(tmp_path: Path) -> None:
    assert not [m for m in lightning_warnings_of_restart(tmp_path, StreamModel) if NOT_RESUMABLE in m]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_loader_that_cannot_be_positioned_keeps_the_warning(tmp_path: Path) -> None:
    assert [m for m in lightning_warnings_of_restart(tmp_path, OwnBatchesModel) if NOT_RESUMABLE in m]
