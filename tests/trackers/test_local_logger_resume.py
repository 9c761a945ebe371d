"""LocalLoggerResume: Lightning's default logger and explicit TensorBoard/CSV loggers continue one version
dir through a SIGKILL and a SIGTERM, every step logged once, read back with TensorBoard's own event
reader and from ``metrics.csv``."""

from __future__ import annotations

import csv
import logging
import random
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import yaml
from _tracker_data import only_run_dir, read_sidecar_file, run_tracker_job
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_resume import LocalLoggerResume, RequeueCheckpoint, RunDir
from lightning_resume._compat.lightning import QuietLightning, log_dir_exists
from lightning_resume.trackers import _local_logs

pytest.importorskip("tensorboard")

STEPS, EVERY = 20, 3


def interrupt_twice(workdir: Path, tracker: str) -> str:
    """SIGKILL at a random step, SIGTERM at a later random step, then an attempt that finishes.

    The SIGKILL lands between two checkpoints, after a step the restart logs again, so the killed
    attempt leaves rows past the resumed step. Returns the steps chosen, for failure messages.
    """
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    kill = rng.choice([s for s in range(4, 11) if (s - 1) % EVERY != 0])
    term = rng.randint(kill + 2, STEPS - 3)
    chosen = f"seed {seed}: SIGKILL at {kill}, SIGTERM at {term}"
    for how, step in (("kill", kill), ("term", term), (None, None)):
        args = ["--steps", STEPS, "--every", EVERY, "--project", "local"]
        args += ["--kill-at", step, "--signal", how] if how else []
        result = run_tracker_job(workdir, tracker, *args, LIGHTNING_RESUME_KEY="logs")
        assert result.returncode == (-9 if how == "kill" else 0), f"{chosen}\n{result.output[-3000:]}"
        assert result.finished == (how is None), f"{chosen}\n{result.output[-3000:]}"
    return chosen


def tensorboard_steps(log_dir: Path) -> tuple[list[tuple[int, float]], list[int]]:
    """``(step, value)`` of ``echo`` as TensorBoard shows it, and the raw steps in the event files."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    shown = [(event.step, event.value) for event in accumulator.Scalars("echo")]
    raw = []
    for file in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in event_file_loader.EventFileLoader(str(file)).Load():
            if any(value.tag == "echo" for value in event.summary.value):
                raw.append(event.step)
    return shown, raw


def csv_steps(log_dir: Path) -> list[tuple[int, float]]:
    with open(log_dir / "metrics.csv", newline="") as f:
        return [(int(row["step"]), float(row["echo"])) for row in csv.DictReader(f) if row.get("echo")]


def every_step_once(pairs: list[tuple[int, float]]) -> bool:
    return pairs == [(step, float(step)) for step in range(STEPS)]


def test_default_tensorboard_logger_continues_one_version(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "default")
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"], chosen
    version = tmp_path / "lightning_logs" / "version_0"
    shown, raw = tensorboard_steps(version)
    assert every_step_once(shown), f"{chosen}: {shown}"
    assert len(raw) > STEPS, f"{chosen}: the killed attempt's later events are in the files ({raw})"
    run_dir = only_run_dir(tmp_path)
    assert (run_dir / "logs" / "tensorboard").resolve() == version.resolve()
    assert read_sidecar_file(run_dir, "tensorboard")["identity"]["version"] == 0


@pytest.mark.slow  # the TensorBoard case (the default logger) stays in the default run
def test_default_csv_logger_continues_one_version(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "default-csv")
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"], chosen
    version = tmp_path / "lightning_logs" / "version_0"
    assert every_step_once(csv_steps(version)), f"{chosen}: {csv_steps(version)}"
    assert not (version / _local_logs.KEPT).exists()
    assert (only_run_dir(tmp_path) / "logs" / "csv").resolve() == version.resolve()


@pytest.mark.slow
def test_explicit_tensorboard_and_csv_loggers_with_fixed_versions_continue(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "local")
    logs = tmp_path / "trackers" / "lightning_logs"
    assert sorted(p.name for p in logs.iterdir()) == ["fixed", "version_0"], chosen
    shown, _ = tensorboard_steps(logs / "fixed")
    assert every_step_once(shown), f"{chosen}: {shown}"
    # CSVLogger(version=0) deletes metrics.csv when its writer starts in a non-empty dir: the rows of the
    # interrupted attempts survive only because they were set aside before fit.
    assert every_step_once(csv_steps(logs / "version_0")), f"{chosen}: {csv_steps(logs / 'version_0')}"


class Echo(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("echo", float(self.global_step))
        return super().training_step(batch, batch_idx)


class StopAtTrainStart(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise RuntimeError("stopped before the first batch")


def attempt(tmp_path: Path, steps: int, hparams: dict[str, Any], *extra: pl.Callback) -> pl.Trainer:
    """One attempt in this process, its loggers given ``hparams`` before ``fit`` (as
    lightning-hydra-template's ``log_hyperparameters`` does)."""
    logs = tmp_path / "logs"
    loggers = [CSVLogger(logs, name="csv"), TensorBoardLogger(logs, name="tb", default_hp_metric=False)]
    callbacks = [RunDir(root=tmp_path / "runs", key="k"), RequeueCheckpoint(every_n_train_steps=1)]
    trainer = tiny_trainer(
        *callbacks,
        LocalLoggerResume(),
        *extra,
        tmp_path=tmp_path,
        logger=loggers,
        max_steps=steps,
        max_epochs=3,
        log_every_n_steps=1,
    )
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)
    trainer.fit(Echo())
    return trainer


def test_hparams_logged_before_fit_leave_one_version_dir_per_logger(tmp_path: Path) -> None:
    attempt(tmp_path, 3, {"lr": 0.1, "launch": 1})
    attempt(tmp_path, 6, {"lr": 0.1, "launch": 2})
    for name in ("csv", "tb"):
        assert sorted(p.name for p in (tmp_path / "logs" / name).iterdir()) == ["version_0"], name
    version = tmp_path / "logs" / "csv" / "version_0"
    assert yaml.safe_load((version / "hparams.yaml").read_text()) == {"lr": 0.1, "launch": 2}
    assert [step for step, _ in csv_steps(version)] == list(range(6))


def test_a_restart_stopped_before_its_first_batch_says_the_rows_are_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempt(tmp_path, 3, {"launch": 1})
    caplog.set_level(logging.INFO, logger="lightning_resume")
    with pytest.raises(RuntimeError, match="stopped before the first batch"):
        attempt(tmp_path, 6, {"launch": 2}, StopAtTrainStart())
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("lightning_resume.trackers")]
    assert not [line for line in lines if "None" in line], lines
    assert "Restart: csv logs of the interrupted attempt kept whole (this attempt ran no batch)" in lines
    assert [step for step, _ in csv_steps(tmp_path / "logs" / "csv" / "version_0")] == [0, 1, 2]


# -- the file functions -----------------------------------------------------------------------------


def test_merge_keeps_rows_before_the_resumed_step_and_drops_a_torn_row(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("echo,epoch,loss,step\n0,0,1.5,0\n1,0,1.4,1\n2,0,1.3,2\n3,0,1.")
    assert _local_logs.set_aside_metrics(tmp_path)
    assert not (tmp_path / "metrics.csv").exists()
    (tmp_path / "metrics.csv").write_text("epoch,step,val\n0,2,9\n")  # this attempt's first row
    header = _local_logs.merge_kept_rows(tmp_path, 2)
    assert header == ["echo", "epoch", "loss", "step", "val"]
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(row["step"], row["echo"], row["val"]) for row in rows] == [
        ("0", "0", ""),
        ("1", "1", ""),
        ("2", "", "9"),
    ]
    assert not (tmp_path / _local_logs.KEPT).exists()


def test_a_kept_file_of_a_restart_that_died_before_merging_stays(tmp_path: Path) -> None:
    (tmp_path / _local_logs.KEPT).write_text("step\n0\n")
    assert _local_logs.set_aside_metrics(tmp_path)
    assert (tmp_path / _local_logs.KEPT).read_text() == "step\n0\n"
    _local_logs.put_back_metrics(tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == "step\n0\n"


def test_quiet_deletion_warning_matches_only_its_dir_until_removed(tmp_path: Path) -> None:
    owner = type("Owner", (), {})()
    message = "Experiment logs directory lightning_logs/version_{} exists and is not empty."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = QuietLightning(owner, log_dir_exists(tmp_path / "lightning_logs" / "version_0"))
        warnings.warn(message.format(0), stacklevel=1)
        warnings.warn(message.format(1), stacklevel=1)
        quiet.remove()
        warnings.warn(message.format(0), stacklevel=1)
    assert [str(w.message) for w in caught] == [message.format(1), message.format(0)]
