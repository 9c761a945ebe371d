"""TrackioResume + TrackioLogger: a restarted job continues its trackio run (real trackio, SQLite)."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _tracker_data import (
    StepCounter,
    dead_network_env,
    fit_tiny,
    only_run_dir,
    preempt,
    read_sidecar_file,
    trackio_dir_for_tests,
    trackio_rows,
)

from lightning_resume import TrackioResume
from lightning_resume.loggers import TrackioLogger
from lightning_resume.run_dir.binding import PROCESS

TRACKIO_DIR = trackio_dir_for_tests()
pytest.importorskip("trackio")
STEPS = 20


@pytest.fixture(autouse=True)
def new_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    restart(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var, value in dead_network_env().items():
        monkeypatch.setenv(var, value)
    yield


@pytest.fixture
def project() -> str:
    return f"resume-{uuid.uuid4().hex[:8]}"


def restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RunDir constructed yet, as in a new process."""
    PROCESS.reset()


def fit_trackio(root: Path, project: str, resume: TrackioResume | None, steps: int, **kwargs: str) -> str:
    """Fit in this process; return the trackio run id."""
    logger = TrackioLogger(project=project, auto_log_cpu=False, **kwargs)  # type: ignore[arg-type]
    fit_tiny(root, logger, *([resume] if resume else []), steps=steps)
    return str(logger.experiment.id)


@pytest.mark.long
def test_preempted_job_continues_one_trackio_run_with_continuous_steps(tmp_path: Path) -> None:
    kills = sorted(random.Random(6).sample(range(2, STEPS - 1), 2))
    preempt(tmp_path, "trackio", 95, kills, "--every", 5, "--steps", STEPS)
    identity = read_sidecar_file(only_run_dir(tmp_path), "trackio")["identity"]
    rows = trackio_rows(tmp_path / "trackio", "resume-test")
    assert {(row.run_id, row.run_name) for row in rows} == {(identity["id"], identity["name"])}
    assert [row.step for row in rows] == list(range(STEPS)), "no step lost or repeated, in order"
    assert all(row.metrics["echo"] == row.step and "loss" in row.metrics for row in rows)
    assert identity["dir"] == str((tmp_path / "trackio").resolve())


def test_in_process_restart_continues_the_run(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_trackio(tmp_path, project, TrackioResume(), steps=3, group="g")
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    sidecar = read_sidecar_file(run_dir, "trackio")
    rows = trackio_rows(TRACKIO_DIR, project)
    assert sidecar["identity"] == {
        "id": first,
        "name": rows[0].run_name,
        "project": project,
        "group": "g",
        "dir": str(TRACKIO_DIR.resolve()),
        "url": None,
    }
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["callbacks"]["TrackioResume"] == {"identity": sidecar["identity"]}
    restart(monkeypatch)
    assert fit_trackio(tmp_path, project, TrackioResume(), steps=6, group="g") == first
    assert [(row.run_id, row.step) for row in trackio_rows(TRACKIO_DIR, project)] == [
        (first, step) for step in range(6)
    ]


def test_without_trackio_resume_a_restart_starts_a_new_run(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: without the callback nothing records the run, so the restart makes a new one."""
    first = fit_trackio(tmp_path, project, None, steps=2)
    restart(monkeypatch)
    assert fit_trackio(tmp_path, project, None, steps=4) != first
    assert len({row.run_name for row in trackio_rows(TRACKIO_DIR, project)}) == 2


def test_sidecar_from_another_project_is_refused_and_a_new_run_starts(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_trackio(tmp_path, project, TrackioResume(), steps=2)
    restart(monkeypatch)
    other = f"{project}-b"
    with pytest.warns(UserWarning, match=rf"project '{project}' \(recorded\) vs '{other}' \(now\)"):
        second = fit_trackio(tmp_path, other, TrackioResume(), steps=4)
    assert second != first
    assert [row.step for row in trackio_rows(TRACKIO_DIR, other)] == [2, 3], "training resumed"
    assert {row.run_id for row in trackio_rows(TRACKIO_DIR, project)} == {first}, "nothing written there"
    assert read_sidecar_file(next(tmp_path.glob("[0-9]*/[0-9]*/*")), "trackio")["identity"]["id"] == second


def test_sidecar_from_another_storage_dir_is_refused(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_trackio(tmp_path, project, TrackioResume(), steps=2)
    sidecar = next(tmp_path.glob("[0-9]*/[0-9]*/*/trackio_resume.json"))
    data = json.loads(sidecar.read_text())
    data["identity"]["dir"] = str(tmp_path / "elsewhere")  # as if written with another TRACKIO_DIR
    sidecar.write_text(json.dumps(data))
    restart(monkeypatch)
    with pytest.warns(UserWarning, match=r"not continuing trackio run .*dir '.*elsewhere' \(recorded\)"):
        assert fit_trackio(tmp_path, project, TrackioResume(), steps=4) != first


def test_another_run_with_the_recorded_name_is_never_written_into(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_trackio(tmp_path, project, TrackioResume(), steps=2)
    name = trackio_rows(TRACKIO_DIR, project)[0].run_name
    # Someone else starts a new run under the same name.
    other = TrackioLogger(project=project, name=name, resume="never", auto_log_cpu=False)
    other.log_metrics({"x": 1.0}, step=0)
    other_id = other.experiment.id
    other.finalize("success")
    restart(monkeypatch)
    with pytest.warns(UserWarning, match="also has run.* with that name"):
        second = fit_trackio(tmp_path, project, TrackioResume(), steps=4)
    assert second not in (first, other_id)
    rows = trackio_rows(TRACKIO_DIR, project)
    assert [row.step for row in rows if row.run_id == other_id] == [0], "the other run is untouched"
    assert [row.step for row in rows if row.run_id == second] == [2, 3]


def test_corrupt_sidecar_warns_once_and_the_checkpoint_resume_proceeds(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_trackio(tmp_path, project, TrackioResume(), steps=3)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    (run_dir / "trackio_resume.json").write_text('{"tracker": "trackio", "identity": {"id": "x"}}')
    restart(monkeypatch)
    counter = StepCounter()
    logger = TrackioLogger(project=project, auto_log_cpu=False)
    with pytest.warns(UserWarning) as caught:
        trainer = fit_tiny(tmp_path, logger, TrackioResume(), counter, steps=5)
    ours = [str(w.message) for w in caught if "trackio" in str(w.message).lower()]
    assert len(ours) == 1 and "has no usable 'name'" in ours[0], ours
    assert (trainer.global_step, counter.batches) == (5, 2), "training resumed from the checkpoint"
    assert logger.experiment.id != first
    assert read_sidecar_file(run_dir, "trackio")["identity"]["id"] == logger.experiment.id


def test_explicit_run_name_wins_over_the_recorded_one(
    tmp_path: Path, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_trackio(tmp_path, project, TrackioResume(), steps=2)
    restart(monkeypatch)
    second = fit_trackio(tmp_path, project, TrackioResume(), steps=4, name="renamed")
    assert second != first
    assert {row.run_name for row in trackio_rows(TRACKIO_DIR, project) if row.run_id == second} == {"renamed"}


def test_two_loggers_on_different_trackio_runs_are_refused(tmp_path: Path, project: str) -> None:
    loggers = [TrackioLogger(project=project, auto_log_cpu=False), TrackioLogger(project=f"{project}-2")]
    with pytest.raises(ValueError, match="Trainer's 2 trackio loggers log to 2 different runs"):
        fit_tiny(tmp_path, loggers, TrackioResume(), steps=1)
