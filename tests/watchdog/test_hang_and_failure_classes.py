"""A rank whose watchdog fires: hung, it records the ``hang`` class and rank 0 closes the attempt with it;
stuck in a collective on a peer that failed first, it exits with that peer's class instead (the root
cause wins on every rank)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import NoReturn

import pytest

from lightning_resume.exit_status import records
from lightning_resume.exit_status.records import FailureRecord
from lightning_resume.failure_classes import FailureClass
from lightning_resume.run_dir import attempts, hangs
from lightning_resume.run_dir.attempts import Attempt, History
from lightning_resume.run_dir.hangs import Section
from lightning_resume.run_dir.status import read_status
from lightning_resume.watchdog.action import Who, act_on_hang
from lightning_resume.watchdog.monitor import Progress


class Exited(Exception):
    pass


def _raise(code: int) -> NoReturn:
    raise Exited(code)


def hang(run_dir: Path) -> int:
    """Rank 0 of 2 acts on a hang in attempt 4 (open in ``attempts.json``); its exit status."""
    attempts.write(run_dir, History(attempts=(Attempt(4, "node", 1, None, time.time() - 60),)))
    progress = Progress(Section.STEP, 7, time.monotonic() - 9.0, timeout=8.0)
    with pytest.raises(Exited) as exited:
        act_on_hang(Who(0, 2, run_dir, 4), progress, 9.0, {}, linger=0.0, exit=_raise)
    return int(exited.value.args[0])


def test_a_hung_rank_records_the_hang_class_and_rank_0_closes_the_attempt_with_it(tmp_path: Path) -> None:
    assert hang(tmp_path) == FailureClass.HANG.exit_code
    (mine,) = records.read(tmp_path, 4)
    assert (mine.failure, mine.rank, mine.original) == (FailureClass.HANG, 0, True)
    end = attempts.read(tmp_path).last.end  # type: ignore[union-attr]
    assert end is not None and (end.cause, end.failure, end.exit_code) == (attempts.Cause.HUNG, "hang", 75)


def test_a_rank_waiting_on_a_failed_peer_exits_with_the_peers_class(tmp_path: Path) -> None:
    oom = FailureClass.OUT_OF_MEMORY
    records.write(tmp_path, FailureRecord(oom, oom.exit_code, 1, 1, 4, time.time(), "OutOfMemoryError: CUDA"))
    assert hang(tmp_path) == oom.exit_code
    assert not hangs.read_notes(tmp_path)  # not hung: waiting on rank 1
    mine = next(r for r in records.read(tmp_path, 4) if r.rank == 0)
    assert (mine.failure, mine.cause_rank) == (oom, 1)
    end = attempts.read(tmp_path).last.end  # type: ignore[union-attr]
    assert end is not None and (end.cause, end.failure, end.exit_code, end.rank) == (
        attempts.Cause.FAILED,
        "out-of-memory",
        71,
        1,
    )
    assert read_status(tmp_path)["status"] == "failed"
