"""The log says what happened: no "restart" for ``trainer.test()`` after ``fit`` in one process, no
"fit stopped" for a failed ``test``, and Lightning names the checkpoint a restart really restored."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir


def attempt(tmp_path: Path, steps: int, model: pl.LightningModule | None = None, **fit: Any) -> pl.Trainer:
    trainer = tiny_trainer(
        RunDir(root=tmp_path / "runs", key="k"),
        RequeueCheckpoint(),
        tmp_path=tmp_path,
        max_steps=steps,
        max_epochs=3,
    )
    trainer.fit(model or BoringModel(), **fit)
    return trainer


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.fixture
def hydra_launch(tmp_path: Path) -> Iterator[Path]:
    """This process as a Hydra application's launch, with its output dir (``.hydra/config.yaml``)."""
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.yaml").write_text("lr: 0.1\n")
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        config = compose("app", return_hydra_config=True)
    output = tmp_path / "outputs" / "launch"
    with open_dict(config):
        config.hydra.runtime.output_dir = str(output)
        config.hydra.job.chdir = False
    (output / ".hydra").mkdir(parents=True)
    (output / ".hydra" / "config.yaml").write_text("lr: 0.1\n")
    HydraConfig.instance().set_config(config)
    yield output
    HydraConfig.instance().cfg = None  # type: ignore[assignment]


def test_test_after_fit_in_the_same_process_is_not_called_a_restart(
    tmp_path: Path, hydra_launch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lightning_resume")
    model = BoringModel()
    trainer = attempt(tmp_path, 2, model)
    trainer.test(model)
    assert not messages(caplog, "configuration is unchanged")
    attempt(tmp_path, 4)  # a real restart of the run says it once
    assert len(messages(caplog, "the Hydra configuration is unchanged")) == 1


class FailingTest(BoringModel):
    def test_step(self, batch: Any, batch_idx: int) -> Any:
        raise ValueError("a bug in test_step")


def test_a_failed_test_is_not_reported_as_a_stopped_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = FailingTest()
    trainer = attempt(tmp_path, 2, model)
    with pytest.raises(ValueError, match="a bug in test_step"):
        trainer.test(model)
    assert not messages(caplog, "stopped by")

    class FailingFit(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise ValueError("a bug in training_step")

    with pytest.raises(ValueError, match="a bug in training_step"):
        attempt(tmp_path, 4, FailingFit())
    assert len(messages(caplog, "fit stopped by ValueError; ")) == 1


def test_a_restart_given_another_ckpt_path_is_reported_as_restored_from_its_last_ckpt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning's logger keeps its lines to itself (propagate=False) until something changes that.
    monkeypatch.setattr(logging.getLogger("lightning.pytorch"), "propagate", True)
    first = attempt(tmp_path, 2)
    last = Path(first.checkpoint_callbacks[0].ckpt_path)  # RequeueCheckpoint's
    users = tmp_path / "pretrained.ckpt"
    shutil.copy(last, users)
    caplog.set_level(logging.INFO)
    with pytest.warns(UserWarning, match="resuming from .* instead of"):
        attempt(tmp_path, 4, ckpt_path=users)
    assert messages(caplog, "Restored all states") == [f"Restored all states from the checkpoint at {last}"]
