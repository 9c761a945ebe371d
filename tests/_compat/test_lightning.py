"""Pins the Lightning internals lightning_resume touches; fails loudly when Lightning changes them."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import tiny_trainer
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from torch.utils.data import DataLoader, DistributedSampler

from lightning_resume._compat.lightning import (
    LastCheckpointCallback,
    MLflowTarget,
    NextLoad,
    between_epochs,
    callback_metrics,
    capture_checkpoint,
    continue_csv_rows,
    epoch_accumulators,
    logging_step,
    mark_between_epochs,
    mlflow_target,
    point_logger_at_version,
    put_back_callback_metrics,
    put_back_epoch_accumulators,
    put_callback,
    rebuilds_ddp_buckets,
    redo_validation_on_restart,
    replace_train_loader_states,
    report_checkpoint_path,
    restart_train_iterator,
    saves_directory,
    set_epoch_position,
    set_mlflow_run,
    settle_validation_progress,
    start_epoch_afresh,
    stop_deferred,
    take_callback,
    train_loader_states,
    watch_train_loaders,
    wrapped_sampler,
)
from lightning_resume.exact_resume.remaining_order import RemainingOrder
from lightning_resume.last_ckpt.redirect import RedirectFirstLoad

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared


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
    trainer_for(tmp_path, Reverse()).fit(model)
    assert model.seen == [5, 4, 3, 2, 1, 0]


class Seen(BoringModel):
    """Records the first value of every training batch and counts validation batches."""

    def __init__(self) -> None:
        super().__init__()
        self.first: list[float] = []
        self.val_batches = 0

    def train_dataloader(self) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        data = torch.arange(8, dtype=torch.float32).unsqueeze(1).repeat(1, 32)
        return StatefulDataLoader(data, batch_size=1)

    def val_dataloader(self) -> Any:
        return DataLoader(RandomDataset(32, 3), batch_size=1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.first.append(float(batch[0, 0]))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.val_batches += 1
        return super().validation_step(batch, batch_idx)


def trainer_for(tmp_path: Path, *callbacks: pl.Callback, **options: Any) -> pl.Trainer:
    defaults: dict[str, Any] = dict(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    return pl.Trainer(callbacks=list(callbacks), **{**defaults, **options})


def test_train_loader_states_live_where_the_fit_loop_reads_them(tmp_path: Path) -> None:
    class SaveAt3(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                trainer.save_checkpoint(tmp_path / "a.ckpt")

    trainer_for(tmp_path, SaveAt3()).fit(Seen())
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=False)
    states = train_loader_states(checkpoint)
    assert states is not None and states[0]["_num_yielded"] == 3

    class Replace(pl.Callback):  # the state of another rank: 5 batches consumed
        def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: Any, ckpt: dict[str, Any]) -> None:
            found = train_loader_states(ckpt)
            assert found is not None
            state = dict(found[0])
            state.update(_num_yielded=5, _sampler_iter_yielded=5)
            # torchdata 0.10 keeps a sampler position in _index_sampler_state, 0.11 in _sampler_iter_state
            where = "_index_sampler_state" if state.get("_index_sampler_state") else "_sampler_iter_state"
            state[where] = {"samples_yielded": 5}
            assert replace_train_loader_states(ckpt, [state])

    model = Seen()
    trainer_for(tmp_path, Replace()).fit(model, ckpt_path=tmp_path / "a.ckpt")
    assert model.first[0] == 5.0  # Lightning loaded the replaced state, not the saved one


def test_set_epoch_position_makes_the_resumed_epoch_count_from_the_given_batch(tmp_path: Path) -> None:
    """Issue 25: a restart that continues an epoch with 2 of its 6 batches left (another split)."""

    class SaveAt2(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 2:
                trainer.save_checkpoint(tmp_path / "a.ckpt")

    trainer_for(tmp_path, SaveAt2()).fit(Recorder())

    class Rest(pl.Callback):
        def __init__(self) -> None:
            self.batch_idx: list[int] = []

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            # As a restart on another number of ranks does: the rest of epoch 0, the whole length kept.
            whole = DistributedSampler(range(6), num_replicas=1, rank=0, shuffle=False)
            trainer.train_dataloader.batch_sampler.sampler = RemainingOrder(whole, 0, [4, 5])
            set_epoch_position(trainer, 4)
            restart_train_iterator(trainer)

        def on_train_batch_start(
            self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            self.batch_idx.append(batch_idx)

    model, rest = Recorder(), Rest()
    trainer = trainer_for(tmp_path, rest, max_epochs=2)
    trainer.fit(model, ckpt_path=tmp_path / "a.ckpt")
    assert model.seen == [4, 5, 0, 1, 2, 3, 4, 5]
    assert rest.batch_idx == [4, 5, 0, 1, 2, 3, 4, 5]  # the epoch ended after its last batch, 5
    assert trainer.global_step == 2 + 2 + 6


def test_the_sampler_lightning_wraps_is_reachable() -> None:
    inner = torch.utils.data.RandomSampler(range(10))
    assert wrapped_sampler(DistributedSamplerWrapper(inner, num_replicas=2, rank=0)) is inner
    assert wrapped_sampler(inner) is None


def test_a_checkpoint_rewritten_inside_validation_redoes_that_validation(tmp_path: Path) -> None:
    class StopInValidation(pl.Callback):
        def on_validation_batch_end(
            self,
            trainer: pl.Trainer,
            pl_module: Any,
            outputs: Any,
            batch: Any,
            batch_idx: int,
            dataloader_idx: int = 0,
        ) -> None:
            if not trainer.sanity_checking and batch_idx == 1:  # of 3
                trainer.save_checkpoint(tmp_path / "v.ckpt")
                raise SystemExit(143)

        def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, ckpt: dict[str, Any]) -> None:
            assert redo_validation_on_restart(ckpt)

    with pytest.raises(SystemExit):
        trainer_for(tmp_path, StopInValidation(), limit_val_batches=3, val_check_interval=4).fit(Seen())

    class Settle(pl.Callback):
        def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            settle_validation_progress(trainer)
            self.total = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total

    model, settle = Seen(), Settle()
    trainer = trainer_for(tmp_path, settle, limit_val_batches=3, val_check_interval=4)
    trainer.fit(model, ckpt_path=tmp_path / "v.ckpt")
    assert model.val_batches == 3 + 3  # the interrupted validation again, then the one at step 8
    assert model.first[0] == 4.0  # training continues after the step that preceded it
    assert settle.total.ready == settle.total.completed


class StepLogger(Logger):
    """Records the steps Lightning logs at."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "steps"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "train_loss" in metrics:
            assert step is not None
            self.steps.append(step)

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass


class Logged(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"])
        return out


def test_logging_step_at_the_first_resumed_batch_is_the_step_that_batch_is_logged_at(tmp_path: Path) -> None:
    class Probe(pl.Callback):
        def __init__(self) -> None:
            self.first: int | None = None

        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            if self.first is None:
                self.first = logging_step(trainer)

    def fit(steps: int, ckpt: str | None) -> tuple[StepLogger, Probe]:
        logger, probe = StepLogger(), Probe()
        trainer = pl.Trainer(
            max_steps=steps,
            limit_val_batches=0,
            logger=logger,
            log_every_n_steps=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[probe, ModelCheckpoint(dirpath=tmp_path, filename="c", every_n_train_steps=3)],
        )
        trainer.fit(Logged(), ckpt_path=ckpt)
        return logger, probe

    first, _ = fit(3, None)
    assert first.steps == [0, 1, 2]
    resumed, probe = fit(6, str(tmp_path / "c.ckpt"))
    assert probe.first == resumed.steps[0] == 3


@pytest.mark.parametrize("kind", [TensorBoardLogger, CSVLogger])
def test_point_logger_at_version_moves_the_next_writer(tmp_path: Path, kind: type) -> None:
    logger = kind(tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    assert Path(logger.log_dir).name == "version_0"
    point_logger_at_version(logger, "again")
    logger.log_metrics({"a": 2.0}, step=1)
    logger.save()
    logger.finalize("success")
    assert Path(logger.log_dir) == tmp_path / "lightning_logs" / "again"
    assert any((tmp_path / "lightning_logs" / "again").iterdir())


def test_continue_csv_rows_appends_under_the_rewritten_header(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    logger.log_metrics({"dropped": 9.0}, step=1)  # held, not saved
    metrics = Path(logger.log_dir) / "metrics.csv"
    metrics.write_text("a,b,step\n1.0,,0\n,2.0,1\n")  # rewritten under the writer
    continue_csv_rows(logger, ["a", "b", "step"])
    logger.log_metrics({"b": 3.0}, step=2)
    logger.save()
    assert metrics.read_text() == "a,b,step\n1.0,,0\n,2.0,1\n,3.0,2\n"


def test_mlflow_target_and_set_mlflow_run_continue_an_existing_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    first = MLFlowLogger("exp", tracking_uri=uri)
    assert mlflow_target(first) == MLflowTarget(uri, "exp", None, False)
    run_id = first.run_id
    assert mlflow_target(first).started
    again = MLFlowLogger("exp", tracking_uri=uri)
    set_mlflow_run(again, run_id)
    again.log_metrics({"m": 1.0}, step=3)
    assert again.run_id == run_id
    experiment = MlflowClient(uri).get_experiment_by_name("exp")
    assert len(MlflowClient(uri).search_runs([experiment.experiment_id])) == 1


def test_comet_logger_starts_in_its_constructor_and_ours_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("comet_ml")
    from lightning.pytorch.loggers import CometLogger as LightningCometLogger

    from lightning_resume.loggers import CometLogger

    for name, value in {
        "COMET_START_ONLINE": "false",
        "COMET_API_KEY": "",
        "COMET_CONFIG": str(tmp_path / "none"),
        "COMET_URL_OVERRIDE": "http://127.0.0.1:9/clientlib/",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    eager = LightningCometLogger(project="p", offline_directory=str(tmp_path))
    assert eager._experiment is not None  # what makes CometLogger too early for COMET_EXPERIMENT_KEY
    eager._experiment.end()
    lazy = CometLogger(project="p", offline_directory=str(tmp_path))
    assert lazy._experiment is None
    monkeypatch.setenv("COMET_EXPERIMENT_KEY", "a" * 32)
    assert lazy.experiment.get_key() == "a" * 32
    lazy.experiment.end()


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
    trainer = trainer_for(tmp_path, max_steps=steps, max_epochs=None)
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


def test_seeing_checkpoints_hands_over_the_checkpoint_after_every_hook_before_it_is_written(
    tmp_path: Path,
) -> None:
    from lightning_resume._compat.lightning import seeing_checkpoints

    class Adds(BoringModel):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:  # the last hook to run
            checkpoint["added"] = torch.nn.MSELoss()

    trainer = trainer_for(tmp_path, max_steps=2, max_epochs=None)
    trainer.fit(Adds())
    seen: list[tuple[bool, bool]] = []
    path = tmp_path / "one.ckpt"
    with seeing_checkpoints(trainer, lambda c: seen.append(("added" in c, path.exists()))):
        trainer.save_checkpoint(path)
    assert seen == [(True, False)] and path.is_file()
    assert "dump_checkpoint" not in trainer._checkpoint_connector.__dict__  # the method is the class's again


def test_resume_even_if_none_restores_the_path_when_lightning_chose_none(tmp_path: Path) -> None:
    from lightning_resume._compat.lightning import resume_even_if_none

    tiny_fit(tmp_path, 2).save_checkpoint(tmp_path / "two.ckpt")

    class Resume(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            self.undo = resume_even_if_none(trainer, str(tmp_path / "two.ckpt"))

    started: list[int] = []

    class First(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            started.append(trainer.global_step)

    trainer = trainer_for(tmp_path, Resume(), First(), max_steps=4, max_epochs=None)
    trainer.fit(BoringModel())  # no ckpt_path, no checkpoint callback: Lightning chose none
    assert (started[0], trainer.global_step, trainer.ckpt_path) == (2, 4, str(tmp_path / "two.ckpt"))
    assert "resume_start" not in trainer._checkpoint_connector.__dict__  # gone after its one call
    # A path Lightning did choose is kept.
    tiny_fit(tmp_path, 3).save_checkpoint(tmp_path / "three.ckpt")
    started.clear()
    trainer = trainer_for(tmp_path, Resume(), First(), max_steps=4, max_epochs=None)
    trainer.fit(BoringModel(), ckpt_path=tmp_path / "three.ckpt")
    assert started[0] == 3


def test_lightning_loads_a_resumed_checkpoint_through_one_strategy_load_call(tmp_path: Path) -> None:
    # The seam of RedirectFirstLoad: fit(ckpt_path=...) calls strategy.load_checkpoint once.
    trainer = tiny_fit(tmp_path, 2)
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    trainer = tiny_fit(tmp_path, 4)
    trainer.save_checkpoint(tmp_path / "four.ckpt")
    redirected: list[str] = []

    class Install(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            redirect = RedirectFirstLoad(str(tmp_path / "four.ckpt"), redirected.append, 1, 1)
            NextLoad(trainer.strategy, redirect).install()

    again = trainer_for(tmp_path, Install(), max_steps=5, max_epochs=None)
    again.fit(BoringModel(), ckpt_path=tmp_path / "two.ckpt")
    assert redirected == [str(tmp_path / "two.ckpt")]
    assert again.global_step == 5  # resumed at 4, not 2
    assert "load_checkpoint" not in again.strategy.__dict__


def test_the_reported_checkpoint_path_is_what_lightning_logs_as_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning stops its logger propagating when imported before the root logger has a handler.
    monkeypatch.setattr(logging.getLogger("lightning.pytorch"), "propagate", True)
    trainer = tiny_fit(tmp_path, 2)
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    shutil.copy(tmp_path / "two.ckpt", tmp_path / "also-two.ckpt")

    class Report(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            original = trainer.strategy.load_checkpoint

            def load(path: Any, *args: Any, **kwargs: Any) -> Any:
                report_checkpoint_path(trainer, str(tmp_path / "also-two.ckpt"))
                return original(path, *args, **kwargs)

            trainer.strategy.load_checkpoint = load  # type: ignore[method-assign]

    caplog.set_level(logging.INFO)
    again = trainer_for(tmp_path, Report(), max_steps=3, max_epochs=None)
    again.fit(BoringModel(), ckpt_path=tmp_path / "two.ckpt")
    restored = [r.getMessage() for r in caplog.records if "Restored all states" in r.getMessage()]
    # (one record per handler Lightning's logger reaches: two on some versions)
    assert set(restored) == {f"Restored all states from the checkpoint at {tmp_path / 'also-two.ckpt'}"}
    assert again.ckpt_path == str(tmp_path / "also-two.ckpt")


# -- epoch boundaries, epoch accumulators, callback metrics (issues 21, 22) --------------------------


class EpochLogged(Recorder):
    """Logs a mean and a sum over each epoch, and a validation metric callbacks read."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("mean", float(batch[0, 0]), on_step=False, on_epoch=True)
        self.log("sum", float(batch[0, 0]), on_step=False, on_epoch=True, reduce_fx="sum")
        return out


def test_train_loaders_pass_process_dataloader_before_their_first_iterator(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Watch(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            self.remove = watch_train_loaders(trainer, lambda dl: seen.append((dl, dl._iterator)))

    watch = Watch()
    trainer = tiny_trainer(watch, tmp_path=tmp_path, max_epochs=2, limit_val_batches=2)
    trainer.fit(Recorder(), val_dataloaders=DataLoader(RandomDataset(32, 4)))
    (loader, iterator), *_ = seen
    assert loader is trainer.train_dataloader and iterator is None
    assert all(dl is loader for dl, _ in seen), "validation loaders are not watched"
    watch.remove()
    assert "process_dataloader" not in trainer.strategy.__dict__


def test_between_epochs_holds_at_the_next_epoch_start_and_restores_as_a_fresh_epoch(tmp_path: Path) -> None:
    class Boundary(pl.Callback):
        def __init__(self) -> None:
            self.states: list[bool] = []
            self.checkpoint: dict[str, Any] | None = None

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.states.append(between_epochs(trainer))
            if trainer.current_epoch == 1:
                self.checkpoint = trainer._checkpoint_connector.dump_checkpoint()

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            self.states.append(between_epochs(trainer))

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.states.append(between_epochs(trainer))

    boundary = Boundary()
    tiny_trainer(boundary, tmp_path=tmp_path, max_epochs=2, limit_train_batches=2).fit(Recorder())
    assert boundary.states == [True, False, False, False, True, False, False, False]
    assert boundary.checkpoint is not None and mark_between_epochs(boundary.checkpoint)
    torch.save(boundary.checkpoint, tmp_path / "boundary.ckpt")

    class Afresh(pl.Callback):
        """Counts the epoch-end hooks the resumed fit runs; starts the epoch afresh when asked."""

        def __init__(self, afresh: bool) -> None:
            self.afresh, self.epoch_ends = afresh, 0

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if self.afresh:
                start_epoch_afresh(trainer)
                self.afresh = False

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.epoch_ends += 1

    # Step-based: Lightning alone keeps the fit "restarting" and runs the previous epoch's end again
    # (and with it the epoch-end hooks); started afresh, the epoch runs as in an uninterrupted fit.
    found = []
    for afresh in (False, True):
        model, counter = Recorder(), Afresh(afresh)
        trainer = tiny_trainer(counter, tmp_path=tmp_path, max_steps=4, max_epochs=-1, limit_train_batches=2)
        trainer.fit(model, ckpt_path=str(tmp_path / "boundary.ckpt"))
        found.append((counter.epoch_ends, model.seen, trainer.global_step))
    # Alone: one epoch end too many, and the resumed epoch serves batch 0 twice.
    assert found == [(2, [0, 0], 4), (1, [0, 1], 4)]


def test_epoch_accumulators_and_callback_metrics_round_trip(tmp_path: Path) -> None:
    class RoundTrip(pl.Callback):
        """After batch 1: take the accumulators and callback metrics, wipe them, put them back."""

        def __init__(self) -> None:
            self.entries: list[dict[str, Any]] = []

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
            if trainer.fit_loop.epoch_loop.batch_idx != 1:
                return
            self.entries = epoch_accumulators(trainer)
            metrics = callback_metrics(trainer)
            trainer.fit_loop.epoch_loop._results.clear()
            put_back_callback_metrics(trainer, {})
            assert trainer.callback_metrics == {}
            trainer._logger_connector._first_loop_iter = None  # as in a fit that has just been restored
            put_back_epoch_accumulators(trainer, self.entries)
            put_back_callback_metrics(trainer, metrics)

    def fit(*callbacks: pl.Callback) -> dict[str, float]:
        trainer = tiny_trainer(*callbacks, tmp_path=tmp_path, max_epochs=1, limit_train_batches=4)
        trainer.fit(EpochLogged())
        return {k: float(v) for k, v in trainer.callback_metrics.items()}

    round_trip = RoundTrip()
    assert fit(round_trip) == fit() == {"mean": 1.5, "sum": 6.0}
    assert sorted(e["key"] for e in round_trip.entries) == ["training_step.mean", "training_step.sum"]
    assert {e["reduce"] for e in round_trip.entries} == {"mean", "sum"}


def test_stop_deferred_until_min_steps_and_lightning_saves_no_trace_of_it(tmp_path: Path) -> None:
    class AskOnce(pl.Callback):
        def __init__(self) -> None:
            self.deferred: list[bool] = []
            self.checkpoint: dict[str, Any] | None = None

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 2:
                trainer.should_stop = True
            if trainer.global_step == 3:
                self.checkpoint = trainer._checkpoint_connector.dump_checkpoint()
            self.deferred.append(stop_deferred(trainer))

    asker = AskOnce()
    trainer = tiny_trainer(asker, tmp_path=tmp_path, max_steps=8, min_steps=5, max_epochs=-1)
    trainer.fit(Recorder())
    assert trainer.global_step == 5 and asker.deferred == [False, True, True, True, False]
    assert asker.checkpoint is not None
    torch.save(asker.checkpoint, tmp_path / "asked.ckpt")
    resumed = tiny_trainer(tmp_path=tmp_path, max_steps=8, min_steps=5, max_epochs=-1)
    resumed.fit(Recorder(), ckpt_path=str(tmp_path / "asked.ckpt"))
    assert resumed.global_step == 8  # Lightning alone forgets the request


class _Last(LastCheckpointCallback):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    @property
    def ckpt_path(self) -> str:
        return str(self.path)


def test_an_on_exception_checkpoint_is_what_fit_resumes_from_and_no_default_checkpoint_is_added(
    tmp_path: Path,
) -> None:

    first = tiny_fit(tmp_path, 3)
    first.save_checkpoint(tmp_path / "mine.ckpt")
    again = tiny_trainer(_Last(tmp_path / "mine.ckpt"), tmp_path=tmp_path, max_steps=5, max_epochs=None)
    assert not [c for c in again.callbacks if isinstance(c, ModelCheckpoint)]  # type: ignore[attr-defined]
    again.fit(BoringModel())  # ckpt_path=None
    assert again.ckpt_path == str(tmp_path / "mine.ckpt") and again.global_step == 5


def test_without_checkpointing_only_last_checkpoint_callbacks_are_taken(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import Checkpoint
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from lightning_resume._compat.lightning import allow_without_checkpointing

    allow_without_checkpointing()  # (done by every LastCheckpointCallback) twice: one wrapper
    ours = _Last(tmp_path / "mine.ckpt")
    trainer = tiny_trainer(ours, tmp_path=tmp_path, enable_checkpointing=False)
    assert trainer.checkpoint_callbacks == [ours]  # and no default ModelCheckpoint beside it
    # What Lightning's own check still refuses: a Checkpoint of the user's.
    for theirs in (ModelCheckpoint(dirpath=tmp_path), Checkpoint()):
        with pytest.raises(MisconfigurationException, match="enable_checkpointing=False"):
            tiny_trainer(ours, theirs, tmp_path=tmp_path, enable_checkpointing=False)
    assert isinstance(tiny_trainer(tmp_path=tmp_path).checkpoint_callback, ModelCheckpoint)


def test_a_callback_put_into_the_list_gets_the_hooks_in_its_place(tmp_path: Path) -> None:
    order: list[str] = []

    class Named(pl.Callback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            order.append(self.name)

    first, second, inserted, early = Named("a"), Named("b"), Named("inserted"), Named("early")

    class Inserting(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            put_callback(trainer, inserted, before=second)
            put_callback(trainer, early)

        def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            take_callback(trainer, inserted)

    trainer = tiny_trainer(first, Inserting(), second, tmp_path=tmp_path)
    trainer.fit(BoringModel())
    assert order == ["early", "a", "inserted", "b"]
    assert inserted not in trainer.callbacks and early in trainer.callbacks  # type: ignore[attr-defined]


def test_ddp_rebuilds_its_buckets_unless_it_searches_for_unused_parameters() -> None:
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    assert rebuilds_ddp_buckets(DDPStrategy())
    assert not rebuilds_ddp_buckets(DDPStrategy(find_unused_parameters=True))
    assert rebuilds_ddp_buckets(DDPStrategy(find_unused_parameters=True, static_graph=True))
    assert not rebuilds_ddp_buckets(SingleDeviceStrategy(torch.device("cpu")))
    # The registry names of Lightning resolve to the same options.
    trainer = pl.Trainer(strategy="ddp_find_unused_parameters_true", accelerator="cpu", devices=1)
    assert not rebuilds_ddp_buckets(trainer.strategy)
    # The rule it mirrors, in torch's reducer: should_rebuild_buckets().
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    assert "_rebuild_buckets" in inspect.getsource(DistributedDataParallel)
