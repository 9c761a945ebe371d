"""Preemption end to end on the real local SLURM cluster: requeue, preemption, signals, arrays, submitit.

Every scenario runs the demo job under ``srun`` with ``RunDir``, ``RequeueCheckpoint`` and
``PreemptionHandler``, interrupts it the way the scheduler would, and checks that it ends COMPLETED with
one run dir and final weights bitwise equal to an uninterrupted run.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import JOB_MODULE, job_env, run_job, same_weights
from jobs.train_job import main as demo_job_main

from .conftest import SlurmCluster

pytestmark = pytest.mark.slurm

ARGS = ("--preemption", "--every", "2", "--step-sleep", "0.25")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final weights of the same job, uninterrupted and outside SLURM."""
    folder = tmp_path_factory.mktemp("slurm-ref")
    result = run_job(folder / "runs", folder / "ref.pt")
    assert result.returncode == 0, result.output
    return folder / "ref.pt"


def submit(
    slurm: SlurmCluster, tmp_path: Path, *sbatch: str, name: str = "job", extra: tuple[str, ...] = ()
) -> str:
    """sbatch the demo job under srun (requeueable, log appended across restarts); return the job id."""
    out = tmp_path / (f"{name}-%a.pt" if "--array" in " ".join(sbatch) else f"{name}.pt")
    command = [sys.executable, "-m", JOB_MODULE, "--root", str(tmp_path / "runs")]
    command += ["--out", str(out).replace("%a", "${SLURM_ARRAY_TASK_ID}"), *ARGS, *extra]
    script = tmp_path / f"{name}.sh"
    script.write_text(
        "#!/bin/bash\nexec srun " + " ".join(c if "$" in c else shlex.quote(c) for c in command) + "\n"
    )
    log = tmp_path / f"{name}-%a.log" if "--array" in " ".join(sbatch) else tmp_path / f"{name}.log"
    return slurm.sbatch(
        "--requeue",
        "--open-mode=append",
        f"--output={log}",
        "--ntasks=1",
        "--cpus-per-task=1",
        *sbatch,
        str(script),
    )


def last_step(run_dir_root: Path) -> int:
    """global_step of the newest last.ckpt under ``run_dir_root`` (-1 if none yet)."""
    steps = [
        torch.load(p, weights_only=False)["global_step"]
        for p in run_dir_root.glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt")
    ]
    return max(steps, default=-1)


def wait_for(predicate: Any, timeout: float, what: str, poll: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_training(slurm: SlurmCluster, job: str, root: Path, past: int, timeout: float = 90) -> None:
    """Wait until ``job`` is running and its last.ckpt is beyond step ``past``."""
    wait_for(
        lambda: last_step(root) > past and (slurm.job(job) or {}).get("JobState") == "RUNNING",
        timeout,
        f"{job} past step {past}",
    )


def restarted(slurm: SlurmCluster, job: str, count: int) -> bool:
    record = slurm.job(job) or {}
    return int(record.get("Restarts", 0)) >= count and record.get("JobState") == "RUNNING"


def finish(slurm: SlurmCluster, job: str, log: Path, timeout: float = 150) -> None:
    slurm.wait_sacct_state(job, "COMPLETED", timeout=timeout)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def check(tmp_path: Path, reference: Path, name: str = "job") -> None:
    run_dirs = list((tmp_path / "runs").glob("[0-9]*/[0-9]*/*"))
    assert len(run_dirs) == 1, run_dirs
    assert same_weights(tmp_path / f"{name}.pt", reference)
    # SLURMEnvironment(auto_requeue=True) is active in these jobs and must have saved nothing.
    assert not list(tmp_path.rglob("hpc_ckpt_*.ckpt"))


def restarts(slurm: SlurmCluster, job: str) -> int:
    """How many times SLURM restarted ``job`` (from accounting, which outlives slurmctld's memory)."""
    record = slurm.job(job)
    if record is not None:
        return int(record.get("Restarts", 0))
    out = slurm.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State")
    return len([line for line in out.splitlines() if line.strip()]) - 1


def report_stops(capsys: pytest.CaptureFixture[str], log: Path) -> None:
    with capsys.disabled():
        for line in log.read_text().splitlines():
            if "Preempted by" in line:
                print(f"\n    {line.split('WARNING ', 1)[-1]}", end="")


@pytest.mark.slow  # the sbatch recipe and test_cluster requeue through scontrol by default
def test_scontrol_requeue_twice(
    slurm: SlurmCluster, tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = submit(slurm, tmp_path)
    root = tmp_path / "runs"
    wait_training(slurm, job, root, past=3)
    for restart in (1, 2):
        requeued_at = time.monotonic()
        slurm.run("scontrol", "requeue", job)
        wait_for(lambda n=restart: restarted(slurm, job, n), 60, f"restart {restart}")
        latency = time.monotonic() - requeued_at
        with capsys.disabled():
            print(f"\n    scontrol requeue -> running again: {latency:.1f} s", end="")
        step = last_step(root)
        wait_training(slurm, job, root, past=step + 1)
    finish(slurm, job, tmp_path / "job.log")
    log = (tmp_path / "job.log").read_text()
    assert log.count("Preempted by SIGTERM") == 2
    assert restarts(slurm, job) == 2, "requeued exactly once per scontrol requeue"
    report_stops(capsys, tmp_path / "job.log")
    check(tmp_path, reference)


@pytest.mark.slow
def test_real_preemption_by_a_higher_priority_partition(
    slurm: SlurmCluster, tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = submit(slurm, tmp_path, "--partition=low", "--exclusive", "--signal=USR1@60")
    root = tmp_path / "runs"
    wait_training(slurm, job, root, past=3)
    high = slurm.sbatch(
        "--partition=high", "--exclusive", f"--output={tmp_path / 'high.log'}", "--wrap=sleep 2"
    )
    finish(slurm, job, tmp_path / "job.log", timeout=180)
    slurm.wait_sacct_state(high, "COMPLETED", timeout=30)
    log = (tmp_path / "job.log").read_text()
    assert "Preempted by SIGUSR1" in log and "requeue: scontrol requeue" in log, log[-3000:]
    assert restarts(slurm, job) == 1
    report_stops(capsys, tmp_path / "job.log")
    check(tmp_path, reference)


@pytest.mark.slow
def test_scancel_signal_usr1_under_srun(
    slurm: SlurmCluster, tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = submit(slurm, tmp_path)
    wait_training(slurm, job, tmp_path / "runs", past=3)
    slurm.run("scancel", "--signal=USR1", job)
    finish(slurm, job, tmp_path / "job.log")
    log = (tmp_path / "job.log").read_text()
    assert "Preempted by SIGUSR1" in log and f"requeue: scontrol requeue {job}" in log, log[-3000:]
    assert restarts(slurm, job) == 1
    report_stops(capsys, tmp_path / "job.log")
    check(tmp_path, reference)


# Slurm sends the warning at its next ~30 s time-limit check: early, late, or after the job ended.
@pytest.mark.slow
def test_time_limit_with_usr1_warning(
    slurm: SlurmCluster, tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One minute limit, warned 50 s before: the job is stopped ~10 s in, requeued, and finishes.
    # Slurm checks time limits every 30 s or so and may signal that much early (sbatch --signal); a
    # USR1 that lands before the interpreter has started kills it (nothing can handle it yet), so
    # that one case is submitted again.
    for attempt in (1, 2):
        folder = tmp_path / f"attempt-{attempt}"
        folder.mkdir()
        job = submit(slurm, folder, "--time=1", "--signal=USR1@50")
        log_path = folder / "job.log"
        try:
            finish(slurm, job, log_path, timeout=180)
            break
        except AssertionError:
            lines = [x for x in (log_path.read_text() if log_path.exists() else "").splitlines() if x.strip()]
            died_at_start = lines and all(x.startswith("srun:") for x in lines)
            if attempt == 2 or not (died_at_start and "User defined signal 1" in lines[-1]):
                raise
    tmp_path = folder
    log = (tmp_path / "job.log").read_text()
    # Stopped while training, or (signalled early) before the first step: then the restart starts over.
    assert "Preempted by SIGUSR1" in log or "stopped before its first checkpoint" in log, log[-3000:]
    report_stops(capsys, tmp_path / "job.log")
    check(tmp_path, reference)


@pytest.mark.slow
def test_array_tasks_resume_into_their_own_dirs(slurm: SlurmCluster, tmp_path: Path, reference: Path) -> None:
    job = submit(slurm, tmp_path, "--array=0-1", name="task")
    root = tmp_path / "runs"
    checkpoints = "[0-9]*/[0-9]*/*/checkpoints/last.ckpt"
    wait_for(lambda: len(list(root.glob(checkpoints))) == 2, 90, "both tasks saving")
    for task in (0, 1):
        slurm.run("scancel", "--signal=USR1", f"{job}_{task}")
    for task in (0, 1):
        slurm.wait_sacct_state(f"{job}_{task}", "COMPLETED", timeout=180)
    run_dirs = sorted(root.glob("[0-9]*/[0-9]*/*"))
    assert len(run_dirs) == 2
    for task in (0, 1):
        log = (tmp_path / f"task-{task}.log").read_text()
        assert f"requeue: scontrol requeue {job}_{task}" in log, log[-3000:]
        assert same_weights(tmp_path / f"task-{task}.pt", reference)
    assert sorted((root / ".index").iterdir()) != [], "each task is indexed under its own key"


# By default, the submitit recipe (tests/slurm/test_recipes_slurm.py) is requeued through submitit.
@pytest.mark.slow
@pytest.mark.parametrize("how", ["interrupt", "preemption"])
def test_submitit_job_is_requeued_through_submitit(
    slurm: SlurmCluster, tmp_path: Path, reference: Path, how: str
) -> None:
    submitit = pytest.importorskip("submitit")
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(
        timeout_min=60,
        slurm_partition="low",
        cpus_per_task=1,
        slurm_additional_parameters={"exclusive": ""} if how == "preemption" else {},
    )
    env = job_env()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**env, **slurm.env}.items():
            patch.setenv(key, value)
        argv = ["--root", str(tmp_path / "runs"), "--out", str(tmp_path / "job.pt"), *ARGS]
        job = executor.submit(demo_job_main, argv)
    slurm.submitted.append(job.job_id)
    wait_training(slurm, job.job_id, tmp_path / "runs", past=3)
    if how == "interrupt":
        job._interrupt()
    else:
        slurm.sbatch("--partition=high", "--exclusive", f"--output={tmp_path / 'high.log'}", "--wrap=sleep 2")
    assert job.result() is None  # raises if the job failed
    log = Path(job.paths.stderr).read_text() + Path(job.paths.stdout).read_text()
    assert "Preempted by" in log and "Requeued job" in log, log[-3000:]
    check(tmp_path, reference)
