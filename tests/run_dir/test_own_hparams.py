"""Pickled hyperparameters (an ``nn.Module``, a ``functools.partial`` optimizer given to ``__init__`` and
kept by ``save_hyperparameters()``) no longer make every restart fail under torch's ``weights_only``
load: the run's own checkpoints may unpickle the types the module's hyperparameters are made of, and
nothing else (one line names the type and the fix)."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import tiny_trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torch import nn

from lightning_resume import DurableCheckpointIO, RequeueCheckpoint, ResumeError, RunDir
from lightning_resume.run_dir import own_hparams

pytestmark = pytest.mark.skipif(not own_hparams.SUPPORTED, reason="torch < 2.5 loads pickles anyway")


class Pickled(BoringModel):
    """``save_hyperparameters()`` of objects, as lightning-hydra-template's module does."""

    def __init__(self, net: nn.Module, optimizer: Callable[..., torch.optim.Optimizer]) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.layer = net

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.hparams.optimizer(params=self.parameters())


class TunedSGD(torch.optim.SGD):
    """An optimizer of the user's own, with SGD's state."""


def pickled(optimizer: type[torch.optim.Optimizer] = torch.optim.SGD) -> Pickled:
    return Pickled(nn.Sequential(nn.Linear(32, 2)), functools.partial(optimizer, lr=0.1))


class FirstStep(pl.Callback):
    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.step = trainer.global_step if self.step is None else self.step


def attempt(
    tmp_path: Path, model: Pickled, steps: int, *extra: pl.Callback, durable: bool = False, **fit: Any
) -> tuple[pl.Trainer, RunDir]:
    run_dir = RunDir(root=tmp_path / "runs", key="k")
    plugins = [DurableCheckpointIO()] if durable else []
    trainer = tiny_trainer(
        *extra,
        run_dir,
        RequeueCheckpoint(),
        tmp_path=tmp_path,
        max_steps=steps,
        max_epochs=5,
        plugins=plugins,
    )
    trainer.fit(model, **fit)
    return trainer, run_dir


def test_the_saved_checkpoint_needs_what_plain_weights_only_refuses(tmp_path: Path) -> None:
    _, run_dir = attempt(tmp_path, pickled(), 2)
    last = run_dir.checkpoint_dir / "last.ckpt"
    assert own_hparams.unsafe_globals(last) == [
        "functools.partial",
        "torch.nn.modules.container.Sequential",
        "torch.nn.modules.linear.Linear",
        "torch.optim.sgd.SGD",
    ]
    with pytest.raises(pickle.UnpicklingError):
        torch.load(last)
    assert set(own_hparams.hparams_globals(pickled().hparams)) >= set(own_hparams.unsafe_globals(last))


@pytest.mark.parametrize("durable", [False, True], ids=["lightning-io", "durable-io"])
def test_a_restart_of_a_module_with_pickled_hparams_resumes(tmp_path: Path, durable: bool) -> None:
    attempt(tmp_path, pickled(), 2, durable=durable)
    seen = FirstStep()
    trainer, run_dir = attempt(tmp_path, pickled(), 4, seen, durable=durable)
    assert (run_dir.is_resumed, seen.step, trainer.global_step) == (True, 2, 4)


def test_a_type_the_module_no_longer_holds_is_refused_in_one_line_naming_it_and_the_fix(
    tmp_path: Path,
) -> None:
    attempt(tmp_path, pickled(torch.optim.SGD), 2)
    with pytest.raises(ResumeError) as refused:
        attempt(tmp_path, pickled(TunedSGD), 4)  # the checkpoint pickles SGD, the module TunedSGD
    message = str(refused.value)
    assert "\n" not in message
    assert "it pickles torch.optim.sgd.SGD," in message and "hyperparameters of Pickled" in message
    assert "torch.serialization.add_safe_globals([torch.optim.sgd.SGD])" in message
    assert "weights_only=False" in message
    assert isinstance(refused.value.__cause__, pickle.UnpicklingError)

    # Either fix works; the user's own allow-list survives the restart's load.
    trainer, _ = attempt(tmp_path, pickled(TunedSGD), 4, weights_only=False)
    assert trainer.global_step == 4
    torch.serialization.add_safe_globals([torch.optim.SGD])
    try:
        trainer, _ = attempt(tmp_path, pickled(TunedSGD), 5)
        assert trainer.global_step == 5
        assert torch.optim.SGD in torch.serialization.get_safe_globals()
    finally:
        torch.serialization.clear_safe_globals()


def test_test_loads_the_runs_best_checkpoint_with_pickled_hparams(tmp_path: Path) -> None:
    model = pickled()
    best = ModelCheckpoint(dirpath=tmp_path / "output" / "checkpoints", monitor="step", mode="max")

    class LogStep(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: Any) -> None:
            module.log("step", float(trainer.global_step))

    trainer, _ = attempt(tmp_path, model, 3, best, LogStep(), durable=True)
    assert Path(best.best_model_path).parent == tmp_path / "output" / "checkpoints"
    trainer.test(model, ckpt_path=best.best_model_path)
    # lightning-hydra-template tests trainer.checkpoint_callback.best_model_path: the first Checkpoint
    # callback, which RequeueCheckpoint (an OnExceptionCheckpoint) would be if listed before it.
    assert trainer.checkpoint_callback is best

    # A file from elsewhere is the user's business: Lightning's own refusal.
    elsewhere = tmp_path / "elsewhere.ckpt"
    elsewhere.write_bytes(Path(best.best_model_path).read_bytes())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        trainer.test(model, ckpt_path=elsewhere)
