"""SwanLabResume: a restarted job continues its SwanLab run (real swanlab, offline, read from its files)."""

from __future__ import annotations

import os
import random
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
    swanlab_runs,
)

from lightning_resume import RunDir, SwanLabResume
from lightning_resume._compat.swanlab import swanlab_place
from lightning_resume.run_dir.binding import PROCESS

swanlab = pytest.importorskip("swanlab")
from swanlab.integration.pytorch_lightning import SwanLabLogger  # noqa: E402

STEPS = 20
HANDED_BACK = ("SWANLAB_RUN_ID", "SWANLAB_RESUME", "SWANLAB_EXP_NAME")


@pytest.fixture(autouse=True)
def new_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts like a fresh process: no RunDir yet, swanlab offline, no active run."""
    restart(monkeypatch)
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    for var, value in dead_network_env().items():
        monkeypatch.setenv(var, value)
    for var in (*HANDED_BACK, "SWANLAB_PROJ_NAME", "SWANLAB_WORKSPACE", "SWANLAB_LOG_DIR"):
        monkeypatch.delenv(var, raising=False)
    yield
    if swanlab.has_run():
        swanlab.finish()


def restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RunDir constructed yet, as in a new process."""
    PROCESS.reset()


def fit_swanlab(
    root: Path, resume: SwanLabResume | None, steps: int, project: str | None = "alpha"
) -> tuple[str, str]:
    """Fit in this process; return the run's ``(id, experiment name)``."""
    logger = SwanLabLogger(project=project, log_dir=str(root / "swanlog"))
    fit_tiny(root, logger, *([resume] if resume else []), steps=steps)
    run = logger.experiment
    identity = (run.id, run.name)
    swanlab.finish()
    return identity


def steps_of(root: Path) -> list[list[int]]:
    return [[step for step, _ in run.scalars["echo"]] for run in swanlab_runs(root / "swanlog")]


@pytest.mark.long
def test_preempted_job_continues_one_swanlab_run_with_continuous_steps(tmp_path: Path) -> None:
    kills = sorted(random.Random(5).sample(range(2, STEPS - 1), 2))
    preempt(tmp_path, "swanlab", 90, kills, "--every", 5, "--steps", STEPS)
    runs = swanlab_runs(tmp_path / "trackers")
    assert len(runs) == 3, "one run folder per attempt"
    identity = read_sidecar_file(only_run_dir(tmp_path), "swanlab")["identity"]
    assert [(run.run_id, run.name, run.project) for run in runs] == [
        (identity["id"], identity["name"], "resume-test")
    ] * 3, "one run id and one experiment name"
    steps = [[step for step, _ in run.scalars["echo"]] for run in runs]
    assert [s[0] for s in steps] == [0, *kills], f"each attempt starts where the previous stopped ({kills})"
    assert [step for attempt in steps for step in attempt] == list(range(STEPS)), "no step lost or repeated"
    for run in runs[1:]:
        assert [value for _, value in run.scalars["echo"]] == [step for step, _ in run.scalars["echo"]]
        assert len(run.scalars["loss"]) == len(run.scalars["echo"])


def test_in_process_restart_continues_the_run_and_puts_the_environment_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_swanlab(tmp_path, SwanLabResume(), steps=3)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    sidecar = read_sidecar_file(run_dir, "swanlab")
    assert sidecar["identity"] == {
        "id": first[0],
        "name": first[1],
        "project": "alpha",
        "workspace": None,
        "mode": "offline",
        "dir": str(tmp_path / "swanlog"),
    }
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["callbacks"]["SwanLabResume"] == {"identity": sidecar["identity"]}
    restart(monkeypatch)
    assert fit_swanlab(tmp_path, SwanLabResume(), steps=6) == first, "same id and experiment name"
    assert not [var for var in HANDED_BACK if var in os.environ], "handed back only until the run exists"
    assert steps_of(tmp_path) == [[0, 1, 2], [3, 4, 5]]


def test_without_swanlab_resume_a_restart_starts_a_new_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same restart without the callback gives a second run with a new name."""
    first = fit_swanlab(tmp_path, None, steps=2)
    restart(monkeypatch)
    second = fit_swanlab(tmp_path, None, steps=4)
    assert second[0] != first[0]
    assert second[1] != first[1]


def test_sidecar_from_another_project_is_refused_and_a_new_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWANLAB_PROJ_NAME", "alpha")
    first = fit_swanlab(tmp_path, SwanLabResume(), steps=2, project=None)
    restart(monkeypatch)
    monkeypatch.setenv("SWANLAB_PROJ_NAME", "beta")
    with pytest.warns(UserWarning, match=r"SWANLAB_PROJ_NAME 'alpha' \(recorded\) vs 'beta' \(now\)"):
        second = fit_swanlab(tmp_path, SwanLabResume(), steps=4, project=None)
    assert second[0] != first[0]
    assert {(run.run_id, run.project) for run in swanlab_runs(tmp_path / "swanlog")} == {
        (first[0], "alpha"),
        (second[0], "beta"),
    }
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    assert read_sidecar_file(run_dir, "swanlab")["identity"]["id"] == second[0]


def test_explicit_log_dir_argument_is_checked_before_the_run_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit_swanlab(tmp_path, SwanLabResume(), steps=2)
    restart(monkeypatch)
    with pytest.warns(
        UserWarning, match=r"not continuing swanlab run .*dir '.*swanlog' \(recorded\) vs '.*other'"
    ):
        keep = [SwanLabResume(log_dir=tmp_path / "other"), RunDir(root=tmp_path, key="job-1")]
    assert keep and not [var for var in HANDED_BACK if var in os.environ]


def test_corrupt_sidecar_warns_and_the_checkpoint_resume_proceeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_swanlab(tmp_path, SwanLabResume(), steps=3)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    (run_dir / "swanlab_resume.json").write_bytes(b"\x00\xff garbage")
    restart(monkeypatch)
    counter = StepCounter()
    logger = SwanLabLogger(project="alpha", log_dir=str(tmp_path / "swanlog"))
    with pytest.warns(UserWarning, match="swanlab sidecar of this restarted run is unusable"):
        trainer = fit_tiny(tmp_path, logger, SwanLabResume(), counter, steps=5)
    assert (trainer.global_step, counter.batches) == (5, 2), "training resumed from the checkpoint"
    assert logger.experiment.id != first[0]
    assert read_sidecar_file(run_dir, "swanlab")["identity"]["id"] == logger.experiment.id


def test_project_and_workspace_are_read_from_the_run(tmp_path: Path) -> None:
    """Pins the one private touch: swanlab keeps a run's project and workspace in its settings."""
    run = swanlab.init(project="pinned", workspace="team", mode="offline", log_dir=str(tmp_path))
    try:
        assert swanlab_place(run) == ("pinned", "team")
    finally:
        swanlab.finish()
