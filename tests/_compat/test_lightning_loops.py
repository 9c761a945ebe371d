"""Pins the Lightning internals of the tuner callbacks, the train loader, its fetcher and the validation's
module modes that ``ExactResume`` touches (``lightning_resume/_compat/lightning.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import tiny_trainer
from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_resume._compat.lightning import (
    forget_train_loader,
    instead_of_tuner_search,
    load_pending_train_loader_states,
    modes_before_validation,
    next_train_batch,
    put_back_tuner_result,
    restoring_tuner_checkpoint,
    transfer_hooks_overridden,
    tuner_result,
    tuners,
)

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared


class Tunable(BoringModel):
    """A module with the attributes the tuners set, and its own loader (BatchSizeFinder needs one)."""

    def __init__(self) -> None:
        super().__init__()
        self.lr, self.batch_size = 0.1, 2

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)


class Loads(pl.Callback):
    """Records, at every load of its state, whether it was a tuner's temporary checkpoint."""

    def __init__(self) -> None:
        self.seen: list[bool] = []
        self.trainer: pl.Trainer | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return {"x": 1}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        assert self.trainer is not None
        self.seen.append(restoring_tuner_checkpoint(self.trainer))


@pytest.mark.parametrize("tuner", [LearningRateFinder(num_training_steps=5), BatchSizeFinder(max_trials=1)])
def test_a_tuner_restores_its_own_checkpoint_through_every_callbacks_load_hooks(
    tmp_path: Path, tuner: pl.Callback
) -> None:
    loads = Loads()
    trainer = tiny_trainer(tuner, loads, tmp_path=tmp_path)
    model = Tunable()
    trainer.fit(model)
    assert loads.seen == [True]  # the search's restore, recognised by its file name
    assert tuners(trainer) == [tuner]
    result = tuner_result(tuner, model)
    attribute = "batch_size" if isinstance(tuner, BatchSizeFinder) else "lr"
    assert result["attribute"] == attribute and result["value"] == getattr(model, attribute)
    assert result["optimal"] is not None

    # Put back on another module, the search replaced by it: a resume's way.
    other = Tunable()
    put_back_tuner_result(tuner, other, result)
    assert getattr(other, attribute) == getattr(model, attribute)
    ran: list[str] = []
    give_back = instead_of_tuner_search(tuner, lambda: ran.append("instead"))
    tuner.on_fit_start(trainer, other)
    assert ran == ["instead"]
    give_back()
    assert "on_fit_start" not in vars(tuner)


def test_a_loader_made_early_keeps_its_restored_states_until_loaded(tmp_path: Path) -> None:
    """Lightning #21765: ``estimated_stepping_batches`` in ``configure_optimizers`` makes the loader
    before the loop's state is restored, and ``setup_data`` then keeps it with its states unloaded."""
    from torch.utils.data import TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_resume._compat.lightning import restart_train_iterator

    rows = TensorDataset(torch.arange(64.0)[:, None].repeat(1, 32))

    class Early(BoringModel):
        def configure_optimizers(self) -> Any:
            assert self.trainer.estimated_stepping_batches > 0
            return super().configure_optimizers()

        def train_dataloader(self) -> StatefulDataLoader:
            return StatefulDataLoader(rows, batch_size=8)  # batch k starts with row 8k

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return super().training_step(batch[0], batch_idx)

    class SaveAtBatch2(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                trainer.save_checkpoint(tmp_path / "mid.ckpt")

    tiny_trainer(SaveAtBatch2(), tmp_path=tmp_path, limit_train_batches=8).fit(Early())
    seen: list[Any] = []

    class Probe(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen.append(load_pending_train_loader_states(trainer))
            restart_train_iterator(trainer)

        def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
            seen.append(float(batch[0][0, 0]))

    resumed = tiny_trainer(Probe(), tmp_path=tmp_path, limit_train_batches=8)
    resumed.fit(Early(), ckpt_path=tmp_path / "mid.ckpt")
    assert seen[:2] == [True, 24.0]  # left unloaded by Lightning; loaded, the epoch goes on at batch 3
    forget_train_loader(tiny_trainer(tmp_path=tmp_path))  # the attribute it clears exists


def test_the_next_batch_is_fetched_into_the_fetchers_prefetch_list(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Peek(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if not seen:
                seen.append(next_train_batch(trainer))

        def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
            if seen and batch_idx == 1:
                seen.append(batch)

    trainer = tiny_trainer(Peek(), tmp_path=tmp_path)
    trainer.fit(BoringModel())
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the step after took the same batch


def test_transfer_hooks_and_modes_inside_a_validation(tmp_path: Path) -> None:
    class Moving(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.frozen = torch.nn.Linear(2, 2)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return batch

    seen: list[Any] = []

    class Probe(pl.Callback):
        def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if not trainer.sanity_checking:
                seen.append(modes_before_validation(trainer))

    model = Moving()
    model.frozen.eval()
    trainer = tiny_trainer(Probe(), tmp_path=tmp_path, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(model)
    assert transfer_hooks_overridden(trainer)
    assert not transfer_hooks_overridden(tiny_trainer(tmp_path=tmp_path))
    (modes,) = seen
    assert modes["frozen"] is False and modes[""] is True  # as training had them, not eval's


def test_a_hook_set_to_not_called_is_skipped(tmp_path: Path) -> None:
    from lightning_resume._compat.lightning import NOT_CALLED

    called: list[str] = []

    class Few(pl.Callback):
        on_before_backward = on_before_zero_grad = on_before_optimizer_step = NOT_CALLED  # type: ignore[assignment]

        def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            called.append("after")

    tiny_trainer(Few(), tmp_path=tmp_path).fit(BoringModel())
    assert called == ["after"] * 4
