"""Requeue once, the way the job was launched (the path ``PreemptionHandler`` and the watchdog share).

``scontrol`` is a stand-in that logs its calls (``tests/_scontrol.py``): these tests pin which calls
are made, and that there is only one requeue.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _scontrol import fake_scontrol

from lightning_resume.preemption.requeue import requeue_after_hang, requeue_job, torchrun_restarts_left


@pytest.fixture
def slurm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    env, log = fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    return log


def test_a_slurm_job_is_requeued_once(slurm_path: Path) -> None:
    assert requeue_job({"SLURM_JOB_ID": "42"}) == "scontrol requeue 42"
    assert slurm_path.read_text().splitlines() == ["-o show job 42", "requeue 42"]


def test_an_array_task_is_requeued_by_its_array_id(slurm_path: Path) -> None:
    env = {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}
    assert requeue_job(env) == "scontrol requeue 40_3"


def test_a_job_the_scheduler_is_already_requeueing_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, log = fake_scontrol(tmp_path, state="REQUEUED")
    monkeypatch.setenv("PATH", env["PATH"])
    assert requeue_job({"SLURM_JOB_ID": "42"}).startswith("none: job 42 is already REQUEUED")
    assert "requeue" not in log.read_text().split()


def test_outside_slurm_nothing_is_requeued() -> None:
    assert requeue_job({}) == "none (not a SLURM job)"


def test_submitit_requeues_first_and_a_failure_falls_back_to_scontrol(slurm_path: Path) -> None:
    told: list[str] = []

    def broken() -> None:
        raise RuntimeError("no pickle")

    assert requeue_job({"SLURM_JOB_ID": "42"}, broken, warn=told.append) == "scontrol requeue 42"
    assert told == ["submitit's requeue failed (RuntimeError('no pickle')); falling back to scontrol"]

    def exits() -> None:
        raise SystemExit(-1)

    with pytest.raises(SystemExit):
        requeue_job({"SLURM_JOB_ID": "42"}, exits)


def test_a_hang_under_torchrun_is_left_to_its_restarts_until_none_is_left(slurm_path: Path) -> None:
    elastic = {"SLURM_JOB_ID": "42", "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert torchrun_restarts_left(elastic) == 2 and torchrun_restarts_left({}) is None
    assert requeue_after_hang(elastic).startswith("none: torchrun restarts the workers (2 restart(s) left)")
    assert not slurm_path.exists()
    assert requeue_after_hang({**elastic, "TORCHELASTIC_RESTART_COUNT": "2"}) == "scontrol requeue 42"
