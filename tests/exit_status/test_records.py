"""The ranks' failure records in the run dir and the root cause they agree on: a communication error takes
a peer's class, the earliest original one; with no peer record it stands."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from lightning_resume.exit_status import records
from lightning_resume.exit_status.records import FailureRecord
from lightning_resume.failure_classes import FailureClass

COMM, OOM, DATA = FailureClass.COMMUNICATION, FailureClass.OUT_OF_MEMORY, FailureClass.DATA


def record(
    failure: FailureClass, rank: int, cause: int | None = None, at: float = 0.0, attempt: int = 3
) -> FailureRecord:
    return FailureRecord(
        failure, failure.exit_code, rank, rank if cause is None else cause, attempt, at, "E: x"
    )


def test_a_communication_error_takes_the_earliest_original_peer_failure() -> None:
    own = record(COMM, 0, at=9.0)
    peers = [
        record(COMM, 2, at=1.0),
        record(DATA, 3, at=5.0),
        record(OOM, 1, at=4.0),
        record(DATA, 4, 3, at=0.5),
    ]
    decided = records.root_cause(own, peers)
    assert (decided.failure, decided.exit_code, decided.cause_rank, decided.rank) == (OOM, 71, 1, 0)
    assert decided.time == own.time and not decided.original


def test_a_failure_of_its_own_class_or_no_other_class_stands() -> None:
    assert records.root_cause(record(DATA, 0), [record(OOM, 1)]) == record(DATA, 0)
    assert records.root_cause(record(COMM, 0), [record(COMM, 1)]) == record(COMM, 0)
    # A peer that took another's class counts when no original record is there.
    assert records.root_cause(record(COMM, 0), [record(OOM, 1, 2)]).cause_rank == 2


def test_records_round_trip_per_attempt_and_old_attempts_are_pruned(tmp_path: Path) -> None:
    records.write(tmp_path, record(OOM, 1))
    records.write(tmp_path, record(COMM, 0, attempt=2))
    (tmp_path / records.DIR / "attempt-3-rank-7.json").write_text("{torn")
    assert records.read(tmp_path, 3) == [record(OOM, 1)]
    records.prune(tmp_path, 3)
    assert sorted(p.name for p in (tmp_path / records.DIR).iterdir()) == [
        "attempt-3-rank-1.json",
        "attempt-3-rank-7.json",
    ]
    assert records.read(tmp_path / "missing", 3) == []


def test_a_communication_error_waits_for_the_peer_that_is_still_writing(tmp_path: Path) -> None:
    writer = threading.Timer(0.5, records.write, (tmp_path, record(OOM, 1)))
    writer.start()
    decided = records.await_root_cause(tmp_path, record(COMM, 0), world_size=2, wait=30)
    writer.join()
    assert (decided.failure, decided.cause_rank) == (OOM, 1)


@pytest.mark.timeout(120)
def test_the_wait_ends_once_every_peer_wrote_or_when_it_is_over(tmp_path: Path) -> None:
    records.write(tmp_path, record(COMM, 1))
    # Every peer has written: no deadline is needed to end the wait.
    assert records.await_root_cause(tmp_path, record(COMM, 0), world_size=2, wait=math.inf) == record(COMM, 0)
    # A peer that never writes (killed): the deadline ends the wait, the own class stands.
    assert records.await_root_cause(tmp_path, record(COMM, 0), world_size=3, wait=0.3) == record(COMM, 0)
