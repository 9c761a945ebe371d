"""What a run pickles into its own checkpoints (an ``nn.Module`` or a ``functools.partial`` kept by
``save_hyperparameters()``, a pandas DataFrame, loss and metric modules that ``on_save_checkpoint`` adds)
no longer makes every restart fail under torch's ``weights_only`` load: each save records what it
pickles, and the run's own checkpoints may unpickle that; a file from elsewhere or an explicit
``weights_only`` keeps torch's rule (one line names the type and the fix)."""

from __future__ import annotations

import collections
import functools
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _retrofit
import lightning.pytorch as pl
import pytest
import torch
from conftest import same_weights, tiny_trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins import TorchCheckpointIO
from torch import nn

from lightning_resume import DurableCheckpointIO, RequeueCheckpoint, ResumeError, RunDir
from lightning_resume.run_dir import layout, own_hparams, save_record
from lightning_resume.run_dir.binding import PROCESS

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


def test_a_type_only_the_runs_saves_pickled_still_loads_at_the_restart(tmp_path: Path) -> None:
    attempt(tmp_path, pickled(torch.optim.SGD), 2)
    assert "torch.optim.sgd:SGD" in save_record.read(layout.run_dirs(tmp_path / "runs")[0]).pickled
    # The restarted module holds TunedSGD, not SGD: what the save pickled is what counts.
    seen = FirstStep()
    trainer, _ = attempt(tmp_path, pickled(TunedSGD), 4, seen)
    assert (seen.step, trainer.global_step) == (2, 4)


def test_an_explicit_weights_only_is_obeyed(tmp_path: Path) -> None:
    attempt(tmp_path, pickled(), 2)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        attempt(tmp_path, pickled(), 4, weights_only=True)  # torch's own rule, unchanged
    trainer, _ = attempt(tmp_path, pickled(), 4, weights_only=False)
    assert trainer.global_step == 4


def test_a_last_ckpt_the_runs_saves_did_not_write_keeps_the_weights_only_rule(tmp_path: Path) -> None:
    _, run_dir = attempt(tmp_path, pickled(), 2)
    # Another run's checkpoint, pickling a type this run never saved, put in place of last.ckpt.
    PROCESS.reset()
    _, other = attempt(tmp_path / "other", pickled(TunedSGD), 2)
    PROCESS.reset()
    shutil.copyfile(other.checkpoint_dir / "last.ckpt", run_dir.checkpoint_dir / "last.ckpt")
    with pytest.raises(ResumeError) as refused:
        attempt(tmp_path, pickled(TunedSGD), 4)
    message = str(refused.value)
    assert "\n" not in message and "saves.json" in message and "weights_only=False" in message
    assert re.search(r"it pickles [\w.]*TunedSGD, which torch's weights_only load refuses", message)
    assert re.search(r"add_safe_globals\(\[[\w.]*TunedSGD\]\)", message)
    assert isinstance(refused.value.__cause__, pickle.UnpicklingError)
    # The user's own allow-list, given before fit, lets it load (RunDir then refuses another run's file).
    torch.serialization.add_safe_globals([TunedSGD])
    try:
        with pytest.raises(ResumeError, match="Refusing to mix two runs"):
            attempt(tmp_path, pickled(TunedSGD), 4)
        assert TunedSGD in torch.serialization.get_safe_globals()
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


# -- what real projects pickle: a DataFrame, loss and metric modules added in on_save_checkpoint --------


def forecaster(extra: Any = None) -> pl.LightningModule:
    from jobs.retrofit_job import Forecaster, frame

    return Forecaster(frame(), extra=extra)


def test_the_census_names_what_a_dataframe_and_metric_modules_pickle_and_only_that_loads_it() -> None:
    from jobs.retrofit_job import Forecaster

    model = forecaster()
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}
    model.on_save_checkpoint(checkpoint)
    found = own_hparams.census(checkpoint)
    assert found is not None
    data, kinds = found
    assert {
        "pandas:DataFrame",
        "pandas._libs.internals:_unpickle_block",  # a Cython function, named by the pickle
        "pyarrow.lib:_restore_array",  # the strings, held by pyarrow
        "pyarrow.lib:py_buffer",
        "pyarrow.lib:type_for_alias",
        "numpy.dtypes:DateTime64DType",  # a class only its state names: rebuilt with a state set on it
        "torchmetrics.regression.mae:MeanAbsoluteError",
        f"{Forecaster.__module__}:QuantileLoss",  # added in on_save_checkpoint
    } <= kinds
    assert own_hparams.unreadable(data, kinds, {}) is None
    fewer = kinds - {"numpy.dtypes:DateTime64DType"}
    assert "DateTime64DType" in str(own_hparams.unreadable(data, frozenset(fewer), {}))
    assert "pandas:DataFrame" not in own_hparams.census(dict(model.state_dict()))[1]  # type: ignore[index]


def test_a_kind_no_restart_can_import_by_its_name_is_named() -> None:
    data, kinds = own_hparams.census({"x": functools.partial(int)}) or (b"", frozenset())
    assert own_hparams.unreadable(data, kinds, {}) is None
    why = own_hparams.unreadable(data, kinds | {"gone.module:Thing"}, {})
    assert why == "it pickles gone.module.Thing, which cannot be imported by that name"


class SeesTheRecord(TorchCheckpointIO):
    """Lightning's writer, noting what ``saves.json`` lists when each checkpoint is written."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[frozenset[str]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.seen.append(save_record.read(layout.run_dirs(Path(path).parents[4])[0]).pickled)
        super().save_checkpoint(checkpoint, path, storage_options)


def test_what_a_save_pickles_is_recorded_in_the_run_dir_before_it_is_written(tmp_path: Path) -> None:
    io = SeesTheRecord()
    run_dir = RunDir(root=tmp_path / "runs", key="k")
    trainer = tiny_trainer(
        run_dir, RequeueCheckpoint(every_n_train_steps=1), tmp_path=tmp_path, max_steps=2, plugins=[io]
    )
    trainer.fit(forecaster())
    assert len(io.seen) == 2 and all("pandas:DataFrame" in kinds for kinds in io.seen)
    assert layout.saves_record(run_dir.path).parent == run_dir.path  # beside checkpoints/, not in it


@pytest.mark.parametrize("durable", [False, True], ids=["lightning-io", "durable-io"])
def test_a_restart_loads_a_dataframe_and_the_modules_on_save_checkpoint_added(
    tmp_path: Path, durable: bool
) -> None:
    attempt(tmp_path, forecaster(), 2, durable=durable)  # type: ignore[arg-type]
    seen = FirstStep()
    trainer, run_dir = attempt(tmp_path, forecaster(), 4, seen, durable=durable)  # type: ignore[arg-type]
    assert (run_dir.is_resumed, seen.step, trainer.global_step) == (True, 2, 4)
    checkpoint = torch.load(run_dir.checkpoint_dir / "last.ckpt", weights_only=False)
    assert checkpoint["hyper_parameters"]["data"].equals(forecaster().hparams.data)
    # Anywhere else the same file keeps torch's rule: another run started from it is refused.
    PROCESS.reset()
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        attempt(tmp_path / "other", forecaster(), 4, ckpt_path=run_dir.checkpoint_dir / "last.ckpt")  # type: ignore[arg-type]


def test_a_save_no_restart_could_load_is_warned_about_once_at_the_first_save(tmp_path: Path) -> None:
    model = forecaster(extra=collections.defaultdict(int, seen=1))  # weights_only cannot rebuild one
    run_dir = RunDir(root=tmp_path / "runs", key="k")
    saves: list[int] = []

    class Saves(pl.Callback):
        def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any) -> None:
            saves.append(trainer.global_step)

    trainer = tiny_trainer(
        run_dir, Saves(), RequeueCheckpoint(every_n_train_steps=1), tmp_path=tmp_path, max_steps=3
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
    told = [str(w.message) for w in caught if "A restart could not load" in str(w.message)]
    assert len(saves) == 3 and len(told) == 1, told
    assert "saved at step 1:" in told[0] and "collections.defaultdict" in told[0]
    assert "weights_only=False" in told[0]


# -- the same, killed and restarted in a process of its own, against an uninterrupted run ----------------


@pytest.mark.parametrize(
    "args",
    [pytest.param((), marks=pytest.mark.long), pytest.param(("--durable",), marks=pytest.mark.slow)],
    ids=["lightning-io", "durable-io"],
)
def test_a_forecasting_project_killed_mid_epoch_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, args: tuple[str, ...]
) -> None:
    output = _retrofit.killed_and_relaunched(tmp_path, *args)
    assert "Restored all states from the checkpoint" in output and "ResumeError" not in output
    assert same_weights(tmp_path / "out.pt", _retrofit.reference(tmp_path_factory))
