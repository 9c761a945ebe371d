"""The template's ``MNISTDataModule`` shape over a synthetic, learnable dataset (no download)."""

from __future__ import annotations

from typing import Any

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split


def make_dataset(size: int, num_classes: int, side: int) -> TensorDataset:
    """``size`` images of ``side x side``, labelled by a fixed random linear teacher (always the same)."""
    generator = torch.Generator().manual_seed(1234)
    images = torch.randn(size, 1, side, side, generator=generator)
    teacher = torch.randn(side * side, num_classes, generator=generator)
    labels = (images.view(size, -1) @ teacher).argmax(dim=1)
    return TensorDataset(images, labels)


class SyntheticDataModule(LightningDataModule):
    """Train/val/test splits of :func:`make_dataset`, loaded as the template loads MNIST."""

    def __init__(
        self,
        data_dir: str = "data/",
        train_val_test_split: tuple[int, int, int] = (512, 128, 128),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        num_classes: int = 10,
        side: int = 8,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Dataset[Any] | None = None
        self.data_val: Dataset[Any] | None = None
        self.data_test: Dataset[Any] | None = None
        self.batch_size_per_device = batch_size

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(
                    f"Batch size {self.hparams.batch_size} is not divisible by the world size."
                )
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if not self.data_train and not self.data_val and not self.data_test:
            dataset = make_dataset(
                sum(self.hparams.train_val_test_split), self.hparams.num_classes, self.hparams.side
            )
            self.data_train, self.data_val, self.data_test = random_split(
                dataset, list(self.hparams.train_val_test_split), generator=torch.Generator().manual_seed(42)
            )

    def _loader(self, dataset: Dataset[Any] | None, shuffle: bool) -> DataLoader[Any]:
        assert dataset is not None
        return DataLoader(
            dataset,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=shuffle,
        )

    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_test, shuffle=False)
