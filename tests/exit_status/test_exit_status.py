"""Failure classes end to end: a 2-rank DDP job (gloo on CPU, each rank a process of the test's own) with a
real fault on rank 1 ends with the same exit status on both ranks and the class in ``attempts.json``;
in one process, what ``ExitStatus`` puts in place is gone after ``fit``, and ``failure_classes=False``
turns it off. The jobs are ``tests/jobs/failure_job.py``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import job_env, tiny_trainer
from lightning.pytorch import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import PreemptionHandler, ProgressWatchdog, RequeueCheckpoint, RunDir
from lightning_resume.exit_status import records
from lightning_resume.exit_status.exit_hook import EXIT_HOOK
from lightning_resume.exit_status.exit_status import ExitStatus
from lightning_resume.failure_classes import FailureClass
from lightning_resume.run_dir import attempts, layout
from lightning_resume.run_dir.attempts import End

KEY = "failure-classes"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def two_ranks(root: Path, *args: str, timeout: float = 400) -> tuple[list[int | None], str]:
    """``jobs.failure_job`` once per rank (Lightning's multi-node launch on one machine): their exit
    statuses and output. A rank still running once the other ended gets a while, then is killed."""
    port, logs = free_port(), [root.parent / f"{root.name}-rank{r}.log" for r in (0, 1)]
    processes = []
    for rank, log in enumerate(logs):
        env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=rank, WORLD_SIZE=2)
        env["LIGHTNING_RESUME_KEY"] = KEY
        command = [sys.executable, "-m", "jobs.failure_job", "--root", str(root), *args]
        with open(log, "ab") as out:
            processes.append(
                subprocess.Popen(
                    command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
    deadline = time.monotonic() + timeout
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(deadline - time.monotonic(), 1))
    codes = [p.poll() for p in processes]
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return codes, "".join(f"--- rank {r}\n{log.read_text(errors='replace')}" for r, log in enumerate(logs))


def last_end(root: Path) -> End:
    (run_dir,) = layout.run_dirs(root)
    last = attempts.read(run_dir).last
    assert last is not None and last.end is not None
    return last.end


def test_rank_1_out_of_memory_ends_both_ranks_with_its_status_and_the_class_in_attempts(
    tmp_path: Path,
) -> None:
    # Rank 0 sees only gloo's "Connection closed by peer": it takes rank 1's record.
    codes, out = two_ranks(tmp_path / "runs", "--fault", "oom")
    status = FailureClass.OUT_OF_MEMORY.exit_code
    assert codes == [status, status], out
    assert "Connection closed by peer" in out or "Connection reset by peer" in out
    end = last_end(tmp_path / "runs")
    assert (end.failure, end.exit_code, end.rank) == ("out-of-memory", status, 1), end
    assert end.error is not None and end.error.startswith("OutOfMemoryError: CUDA out of memory"), end
    report = subprocess.run(
        [sys.executable, "-m", "lightning_resume", "inspect", str(*layout.run_dirs(tmp_path / "runs"))],
        env=job_env(COLUMNS=200),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "attempt 1 ended: out of memory on rank 1, exit 71, retryable" in report.stdout, report


#: Each fault on rank 1, and the class both ranks end with (and the rank it is recorded from).
CASES = {
    "worker": ("--fault", "worker"),
    "nan": ("--fault", "nan"),
    "sigterm": ("--fault", "sigterm"),
    "bug": ("--fault", "bug"),
    "error": ("--fault", "error"),
    "timeout": ("--fault", "timeout", "--pg-timeout", "5"),
    "hang": ("--fault", "hang", "--watchdog"),
}
EXPECTED = {
    "worker": (FailureClass.DATA, 1),
    "nan": (FailureClass.NON_FINITE, 1),
    "sigterm": (FailureClass.PREEMPTED, 0),  # every rank stops for the signal: rank 0 records its own
    "bug": (FailureClass.DO_NOT_RETRY, 1),
    "error": (FailureClass.ERROR, 1),
    "timeout": (FailureClass.COMMUNICATION, 0),  # rank 0's collective times out first
    "hang": (FailureClass.HANG, 1),  # the first rank to report its hang
}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fault_on_rank_1_ends_both_ranks_with_its_class_status(tmp_path: Path, case: str) -> None:
    failure, rank = EXPECTED[case]
    codes, out = two_ranks(tmp_path / "runs", *CASES[case])
    assert codes == [failure.exit_code] * 2, out
    end = last_end(tmp_path / "runs")
    assert (end.failure, end.exit_code) == (failure.value, failure.exit_code), end
    if case != "hang":  # hung: the first rank whose watchdog reported
        assert end.rank == rank, end


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_rank_leaves_no_record_and_the_survivor_reports_its_own_class(tmp_path: Path) -> None:
    codes, out = two_ranks(tmp_path / "runs", "--fault", "kill")
    assert codes == [FailureClass.COMMUNICATION.exit_code, -signal.SIGKILL], out
    end = last_end(tmp_path / "runs")
    assert (end.failure, end.exit_code, end.rank) == ("communication", 76, 0), end


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_crash_loop_stop_ends_both_ranks_with_93(tmp_path: Path) -> None:
    root, args = tmp_path / "runs", ("--fault", "error", "--watchdog", "--max-attempts", "1")
    codes, out = two_ranks(root, *args)
    assert codes == [FailureClass.ERROR.exit_code] * 2, out
    codes, out = two_ranks(root, *args)
    assert codes == [FailureClass.CRASH_LOOP.exit_code] * 2, out
    end = last_end(root)
    assert (end.cause.value, end.failure, end.exit_code) == ("crash-loop-stop", "crash-loop", 93), end


# -- in one process --------------------------------------------------------------------------------


class RaisesAt(BoringModel):
    """Raises ``error`` at training step 1; notes whether an ``ExitStatus`` was in the Trainer."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.error, self.exit_status_seen = error, False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.exit_status_seen = any(isinstance(c, ExitStatus) for c in self.trainer.callbacks)
        if self.error is not None and self.global_step == 1:
            raise self.error
        return super().training_step(batch, batch_idx)


@pytest.fixture
def no_hook_left() -> Iterator[None]:
    before = sys.excepthook
    yield
    EXIT_HOOK.disarm()  # a failed fit in this process armed it: pytest caught the exception
    assert sys.excepthook is before


def fit(tmp_path: Path, model: RaisesAt, *callbacks: Callback) -> RunDir:
    run_dir = RunDir(root=tmp_path / "runs")
    trainer = tiny_trainer(run_dir, RequeueCheckpoint(every_n_train_steps=100), *callbacks, tmp_path=tmp_path)
    try:
        trainer.fit(model)
    finally:
        assert not any(isinstance(c, ExitStatus) for c in trainer.callbacks)  # taken out again
    return run_dir


@pytest.mark.parametrize("callback", [PreemptionHandler, ProgressWatchdog])
def test_a_finished_fit_leaves_nothing_installed_and_no_class(
    tmp_path: Path, no_hook_left: None, callback: type[Callback]
) -> None:
    model = RaisesAt()
    run_dir = fit(tmp_path, model, callback(notices=None) if callback is PreemptionHandler else callback())
    assert model.exit_status_seen
    assert EXIT_HOOK.armed is None and sys.excepthook is not EXIT_HOOK
    assert last_end(run_dir.root).failure is None


def test_a_failed_fit_records_its_class_and_arms_its_status(tmp_path: Path, no_hook_left: None) -> None:
    with pytest.raises(torch.OutOfMemoryError):
        fit(tmp_path, RaisesAt(torch.OutOfMemoryError("out of memory")), PreemptionHandler(notices=None))
    assert EXIT_HOOK.armed == FailureClass.OUT_OF_MEMORY.exit_code and sys.excepthook is EXIT_HOOK
    end = last_end(tmp_path / "runs")
    assert (end.failure, end.exit_code, end.rank) == ("out-of-memory", 71, 0)
    (run_dir_path,) = layout.run_dirs(tmp_path / "runs")
    assert [r.failure for r in records.read(run_dir_path, 1)] == [FailureClass.OUT_OF_MEMORY]


def test_failure_classes_false_turns_it_off(tmp_path: Path, no_hook_left: None) -> None:
    model = RaisesAt(torch.OutOfMemoryError("out of memory"))
    watchdog = (
        ProgressWatchdog()
    )  # on by default: the switch on PreemptionHandler turns it off for the Trainer
    with pytest.raises(torch.OutOfMemoryError):
        fit(tmp_path, model, PreemptionHandler(notices=None, failure_classes=False), watchdog)
    assert not model.exit_status_seen and EXIT_HOOK.armed is None
    assert last_end(tmp_path / "runs").failure is None
    (run_dir_path,) = layout.run_dirs(tmp_path / "runs")
    assert not (run_dir_path / records.DIR).exists()
