"""TrackioLogger: Lightning's Logger interface over a real trackio, read back from trackio's SQLite files."""

from __future__ import annotations

import json
import pickle
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _tracker_data import dead_network_env, fit_tiny, trackio_dir_for_tests, trackio_rows

from lightning_resume.loggers import TrackioLogger
from lightning_resume.trackers.loggers.trackio_logger import import_trackio, storage_dir

TRACKIO_DIR = trackio_dir_for_tests()
pytest.importorskip("trackio")


@pytest.fixture(autouse=True)
def no_run_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var, value in dead_network_env().items():
        monkeypatch.setenv(var, value)
    yield


@pytest.fixture
def project() -> str:
    """A project of its own per test (trackio keeps one database per project)."""
    return f"logger-{uuid.uuid4().hex[:8]}"


def configs(project: str) -> dict[str, dict[str, object]]:
    with sqlite3.connect(TRACKIO_DIR / f"{project}.db") as conn:
        rows = conn.execute("SELECT run_id, config FROM configs").fetchall()
    return {run_id: json.loads(config) for run_id, config in rows}


def test_storage_dir_is_where_trackio_writes(project: str) -> None:
    """Pins trackio's module attribute that TrackioLogger and TrackioResume record as the storage dir."""
    assert storage_dir() == TRACKIO_DIR.resolve()
    logger = TrackioLogger(project=project, auto_log_cpu=False)
    logger.log_metrics({"x": 1.0}, step=0)
    logger.finalize("success")
    assert (TRACKIO_DIR / f"{project}.db").is_file()


def test_metrics_and_hyperparameters_from_a_trainer_are_stored(tmp_path: Path, project: str) -> None:
    logger = TrackioLogger(project=project, group="sweep-1", prefix="train", auto_log_cpu=False)
    logger.log_hyperparams({"lr": 0.05, "activation": torch.nn.ReLU})
    fit_tiny(tmp_path, logger, steps=4)
    rows = trackio_rows(TRACKIO_DIR, project)
    assert [row.step for row in rows] == [0, 1, 2, 3]
    assert [row.metrics["train-echo"] for row in rows] == [0.0, 1.0, 2.0, 3.0]
    assert all("train-loss" in row.metrics for row in rows)
    assert len({row.run_id for row in rows}) == 1
    config = configs(project)[rows[0].run_id]
    assert (config["lr"], config["activation"], config["_Group"]) == (0.05, "ReLU", "sweep-1")


def test_name_is_the_project_and_version_the_run_name(project: str) -> None:
    logger = TrackioLogger(project=project, name="exp-1", auto_log_cpu=False)
    assert (logger.name, logger.version) == (project, "exp-1")
    generated = TrackioLogger(project=project, auto_log_cpu=False)
    assert generated.version is None
    generated.log_metrics({"x": 1.0}, step=0)
    assert generated.version == generated.experiment.name
    generated.finalize("success")
    logger.finalize("success")


def test_use_after_finalize_continues_the_same_run(project: str) -> None:
    logger = TrackioLogger(project=project, auto_log_cpu=False)
    logger.log_metrics({"x": 1.0}, step=0)
    logger.finalize("success")
    logger.log_metrics({"x": 2.0}, step=1)  # e.g. trainer.test() after fit
    logger.finalize("success")
    rows = trackio_rows(TRACKIO_DIR, project)
    assert [(row.step, row.metrics["x"]) for row in rows] == [(0, 1.0), (1, 2.0)]
    assert len({row.run_id for row in rows}) == 1


@pytest.mark.parametrize(("resume", "same_run"), [("allow", True), ("never", False)])
def test_resume_by_name_follows_trackios_rule(project: str, resume: str, same_run: bool) -> None:
    for step in (0, 1):
        logger = TrackioLogger(project=project, name="named", resume=resume, auto_log_cpu=False)  # type: ignore[arg-type]
        logger.log_metrics({"x": float(step)}, step=step)
        logger.finalize("success")
    rows = trackio_rows(TRACKIO_DIR, project)
    assert [row.run_name for row in rows] == ["named", "named"]
    assert (rows[0].run_id == rows[1].run_id) == same_run


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="project must be a non-empty string"):
        TrackioLogger(project="")
    with pytest.raises(ValueError, match="resume must be"):
        TrackioLogger(project="p", resume="sometimes")  # type: ignore[arg-type]


def test_missing_trackio_gives_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "trackio", None)  # what `import trackio` sees when it is not installed
    with pytest.raises(ModuleNotFoundError, match=r'pip install "lightning-resume\[trackio\]"'):
        import_trackio()


def test_logger_pickles_without_its_run(project: str) -> None:
    logger = TrackioLogger(project=project, name="p", auto_log_cpu=False)
    logger.log_metrics({"x": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))
    assert copy._experiment is None and copy.version == "p"
    logger.finalize("success")
