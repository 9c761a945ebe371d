"""WandbResume: a restarted job continues its wandb run (real wandb, offline, read back from .wandb files).

wandb reads ``WANDB_RUN_ID`` once per process, when its session starts, and names offline folders by
the second: restarts are therefore real new processes (``tracker_job.py``); in-process tests cover
what needs no hand-back.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _tracker_data import (
    StepCounter,
    dead_network_env,
    fit_tiny,
    offline_env,
    only_run_dir,
    preempt,
    read_sidecar_file,
    run_tracker_job,
    wandb_runs,
)
from conftest import job_env

from lightning_resume import RunDir, WandbResume
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.trackers.sidecar import Sidecar, sidecar_path, write_sidecar

wandb = pytest.importorskip("wandb")
from lightning.pytorch.loggers import WandbLogger  # noqa: E402

STEPS = 20


@pytest.fixture(autouse=True)
def new_process(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test starts like a fresh process: no RunDir yet, wandb offline, no active run."""
    restart(monkeypatch)
    for var, value in offline_env(tmp_path_factory.getbasetemp() / "wandb-home").items():
        if var.startswith("WANDB_"):  # wandb's own files stay out of $HOME
            monkeypatch.setenv(var, value)
    for var, value in dead_network_env().items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_RUN_ID", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    yield
    wandb.finish()


def restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RunDir constructed yet, as in a new process."""
    PROCESS.reset()


def fit_wandb(root: Path, resume: WandbResume | None, steps: int) -> str:
    logger = WandbLogger(project="alpha", save_dir=str(root))
    fit_tiny(root, logger, *([resume] if resume else []), steps=steps)
    run_id = str(logger.experiment.id)
    wandb.finish()
    return run_id


def logged_steps(save_dir: Path) -> list[list[int]]:
    """``trainer/global_step`` of every history row, per offline folder (attempt)."""
    return [[row["trainer/global_step"] for row in run.history] for run in wandb_runs(save_dir)]


# -- end to end: a real job preempted and restarted ----------------------------------------------


@pytest.mark.long
def test_preempted_job_continues_one_wandb_run_with_continuous_steps(tmp_path: Path) -> None:
    kills = sorted(random.Random(4).sample(range(2, STEPS - 1), 2))
    preempt(tmp_path, "wandb", 77, kills, "--every", 5, "--steps", STEPS)
    runs = wandb_runs(tmp_path / "trackers")
    assert len(runs) == 3, "one offline folder per attempt"
    recorded = read_sidecar_file(only_run_dir(tmp_path), "wandb")["identity"]["id"]
    assert [(run.run_id, run.project) for run in runs] == [(recorded, "resume-test")] * 3
    steps = logged_steps(tmp_path / "trackers")
    assert [s[0] for s in steps] == [0, *kills], f"each attempt starts where the previous stopped ({kills})"
    assert [step for attempt in steps for step in attempt] == list(range(STEPS)), "no step lost or repeated"
    for run in runs[1:]:
        assert all(row["echo"] == row["trainer/global_step"] and "loss" in row for row in run.history)


def test_hard_kill_keeps_the_run_and_replays_from_the_checkpoint(tmp_path: Path) -> None:
    first = run_tracker_job(tmp_path, "wandb", "--kill-at", 9, "--signal", "kill", SLURM_JOB_ID=78)
    assert first.returncode == -9, first.output
    recorded = read_sidecar_file(only_run_dir(tmp_path), "wandb")["identity"]["id"]
    again = run_tracker_job(tmp_path, "wandb", SLURM_JOB_ID=78, SLURM_RESTART_COUNT=1)
    assert again.finished, again.output
    runs = wandb_runs(tmp_path / "trackers")
    assert [run.run_id for run in runs] == [recorded, recorded]
    # The newest checkpoint is step 8's (the kill lands before step 9's save): the restart logs from there.
    assert logged_steps(tmp_path / "trackers")[1] == list(range(8, STEPS))


@pytest.mark.slow
def test_without_wandb_resume_a_restart_starts_a_new_run(tmp_path: Path) -> None:
    """The control: the same preemption and restart without the callback give a second wandb run."""
    preempt(tmp_path, "wandb", 79, [6], "--no-resume")
    first, second = wandb_runs(tmp_path / "trackers")
    assert first.run_id != second.run_id


@pytest.mark.slow
def test_sidecar_from_another_project_is_refused_and_a_new_run_starts(tmp_path: Path) -> None:
    # --project "" leaves the project to WANDB_PROJECT, which changes between the attempts.
    first = run_tracker_job(
        tmp_path, "wandb", "--project", "", "--kill-at", 5, SLURM_JOB_ID=80, WANDB_PROJECT="alpha"
    )
    assert first.returncode == 0 and not first.finished, first.output
    again = run_tracker_job(
        tmp_path, "wandb", "--project", "", SLURM_JOB_ID=80, SLURM_RESTART_COUNT=1, WANDB_PROJECT="beta"
    )
    assert again.finished, again.output
    assert "not continuing wandb run" in again.output
    assert "WANDB_PROJECT 'alpha' (recorded) vs 'beta' (now)" in again.output
    alpha, beta = wandb_runs(tmp_path / "trackers")
    assert (alpha.project, beta.project) == ("alpha", "beta")
    assert alpha.run_id != beta.run_id, "nothing written into the recorded run"
    assert [row["trainer/global_step"] for row in beta.history] == list(range(5, STEPS)), "training resumed"
    sidecar = read_sidecar_file(only_run_dir(tmp_path), "wandb")
    assert sidecar["identity"]["id"] == beta.run_id, "later restarts follow the new run"


@pytest.mark.slow
def test_project_set_only_on_the_logger_is_reported_once_the_run_exists(tmp_path: Path) -> None:
    first = run_tracker_job(tmp_path, "wandb", "--project", "alpha", "--kill-at", 5, SLURM_JOB_ID=81)
    assert first.returncode == 0 and not first.finished, first.output
    again = run_tracker_job(tmp_path, "wandb", "--project", "beta", SLURM_JOB_ID=81, SLURM_RESTART_COUNT=1)
    assert again.finished, again.output
    assert (
        "was continued, but the logger placed it elsewhere (project 'alpha' (recorded) vs 'beta'"
        in again.output
    )
    # The documented limitation: wandb makes a run with the old id in project "beta", a new run there.
    assert [(run.run_id, run.project) for run in wandb_runs(tmp_path / "trackers")][1][1] == "beta"


def test_wandb_reads_the_run_id_variable_when_its_session_starts(tmp_path: Path) -> None:
    """Pins the wandb behaviour the hand-back relies on, and its limit."""
    code = (
        "import os, sys, wandb\n"
        "if sys.argv[1] == 'late': wandb.setup()\n"
        "os.environ['WANDB_RUN_ID'] = 'handed1'\n"
        "print(wandb.init(project='p', dir=sys.argv[2]).id)\n"
    )
    env = job_env(**offline_env(tmp_path))
    ids = [
        subprocess.run(
            [sys.executable, "-c", code, when, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.split()[-1]
        for when in ("early", "late")
    ]
    assert ids[0] == "handed1"
    assert ids[1] != "handed1"


# -- in process: no hand-back involved ------------------------------------------------------------


def test_sidecar_and_checkpoint_record_the_run(tmp_path: Path) -> None:
    run_id = fit_wandb(tmp_path, WandbResume(), steps=3)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    sidecar = read_sidecar_file(run_dir, "wandb")
    assert sidecar["identity"] == {
        "id": run_id,
        "project": "alpha",
        "entity": None,
        "name": None,
        "mode": "offline",
        "dir": str(tmp_path),
    }
    assert sidecar["global_step"] == 3
    assert set(sidecar["environment"]) == {"WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE"}
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["callbacks"]["WandbResume"] == {"identity": sidecar["identity"]}


@pytest.mark.parametrize("run_dir_first", [True, False])
def test_run_id_is_handed_back_before_the_run_exists_in_either_order(
    tmp_path: Path, run_dir_first: bool
) -> None:
    RunDir(root=tmp_path, key="k")  # the first attempt
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    write_sidecar(sidecar_path(run_dir, "wandb"), "wandb", Sidecar({"id": "abc123"}, {"WANDB_PROJECT": None}))
    PROCESS.reset()  # a new process
    if run_dir_first:
        keep = [RunDir(root=tmp_path, key="k"), WandbResume()]
    else:
        keep = [WandbResume(), RunDir(root=tmp_path, key="k")]
    assert keep and os.environ["WANDB_RUN_ID"] == "abc123"


def test_fresh_run_hands_nothing_back(tmp_path: Path) -> None:
    keep = [WandbResume(), RunDir(root=tmp_path, key="k")]
    assert keep and "WANDB_RUN_ID" not in os.environ


def test_explicit_project_argument_is_checked_before_the_run_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit_wandb(tmp_path, WandbResume(), steps=2)
    restart(monkeypatch)
    with pytest.warns(UserWarning, match=r"project 'alpha' \(recorded\) vs 'beta' \(now\)"):
        keep = [WandbResume(project="beta"), RunDir(root=tmp_path, key="job-1")]
    assert keep and "WANDB_RUN_ID" not in os.environ


def test_run_id_already_set_by_the_user_wins_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit_wandb(tmp_path, WandbResume(), steps=2)
    restart(monkeypatch)
    monkeypatch.setenv("WANDB_RUN_ID", "mine")
    with pytest.warns(UserWarning, match="WANDB_RUN_ID='mine' is already set"):
        keep = [WandbResume(), RunDir(root=tmp_path, key="job-1")]
    assert keep and os.environ["WANDB_RUN_ID"] == "mine"


def test_corrupt_sidecar_warns_and_the_checkpoint_resume_proceeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_wandb(tmp_path, WandbResume(), steps=3)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    (run_dir / "wandb_resume.json").write_text('{"identity": {"id": "trunc')
    restart(monkeypatch)
    counter = StepCounter()
    logger = WandbLogger(project="alpha", save_dir=str(tmp_path))
    with pytest.warns(
        UserWarning, match="wandb sidecar of this restarted run is unusable: .* is not valid JSON"
    ):
        trainer = fit_tiny(tmp_path, logger, WandbResume(), counter, steps=5)
    assert (trainer.global_step, counter.batches) == (5, 2), "training resumed from the checkpoint"
    assert logger.experiment.id != first
    assert read_sidecar_file(run_dir, "wandb")["identity"]["id"] == logger.experiment.id, (
        "the sidecar is repaired"
    )


def test_missing_sidecar_is_explained_from_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit_wandb(tmp_path, WandbResume(), steps=2)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    (run_dir / "wandb_resume.json").unlink()
    restart(monkeypatch)
    with pytest.warns(UserWarning, match=f"found no wandb sidecar.*written while logging to run '{first}'"):
        assert fit_wandb(tmp_path, WandbResume(), steps=3) != first


def test_several_wandb_loggers_logging_to_one_run_are_handled(tmp_path: Path) -> None:
    loggers = [
        WandbLogger(project="alpha", save_dir=str(tmp_path)),
        WandbLogger(prefix="copy", save_dir=str(tmp_path)),
    ]
    with pytest.warns(UserWarning, match="reuse this run"):  # Lightning's own note on the second logger
        fit_tiny(tmp_path, loggers, WandbResume(), steps=2)
    run_dir = next(tmp_path.glob("[0-9]*/[0-9]*/*"))
    assert read_sidecar_file(run_dir, "wandb")["identity"]["id"] == loggers[0].experiment.id


def test_trainer_without_a_wandb_logger_gets_one_warning(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="the Trainer has no wandb logger"):
        fit_tiny(tmp_path, False, WandbResume(), steps=2)
    assert not list(tmp_path.glob("[0-9]*/[0-9]*/*/wandb_resume.json"))


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="mode must be"):
        WandbResume(mode="sometimes")  # type: ignore[arg-type]
