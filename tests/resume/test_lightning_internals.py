"""Pins the Lightning internals lightning_resume touches; fails loudly when Lightning changes them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_resume._resume.lightning_internals import (
    MLflowTarget,
    logging_step,
    mlflow_target,
    point_logger_at_version,
    restart_train_iterator,
    set_mlflow_run,
)


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
