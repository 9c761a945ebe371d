"""Each failed rank's ``failures/attempt-<N>-rank-<R>.json``, and the root cause the ranks agree on.
Standard library only: a hung rank's watchdog thread writes one too."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.failure_classes import FailureClass

#: The records' folder in the run dir.
DIR = "failures"
#: Seconds a rank that failed with a communication error waits for a peer's record.
PEER_WAIT_SECONDS = 10.0
_NAME = re.compile(r"^attempt-(\d+)-rank-(\d+)\.json$")


@dataclass(frozen=True)
class FailureRecord:
    """How one rank's ``fit`` failed, or the peer failure it took as its own."""

    failure: FailureClass
    exit_code: int
    rank: int  # the rank that wrote it
    cause_rank: int  # the rank whose failure it is: itself, or the peer whose record it took
    attempt: int
    time: float
    error: str = ""  # the exception that ended the failing rank's fit, in one line

    @property
    def original(self) -> bool:
        return self.rank == self.cause_rank

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "failure": self.failure.value}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> FailureRecord:
        return cls(**{**data, "failure": FailureClass(data["failure"])})  # type: ignore[arg-type]


def write(run_dir: Path, record: FailureRecord) -> None:
    """Write ``record`` atomically (``OSError`` when it cannot be)."""
    target = run_dir / DIR / f"attempt-{record.attempt}-rank-{record.rank}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, record.to_dict())


def read(run_dir: Path, attempt: int) -> list[FailureRecord]:
    """The readable records of ``attempt`` (one being replaced, or not ours, is skipped)."""
    with contextlib.suppress(OSError):
        names = os.listdir(run_dir / DIR)
        found = []
        for name in names:
            match = _NAME.match(name)
            if match and int(match[1]) == attempt:
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    found.append(FailureRecord.from_dict(json.loads((run_dir / DIR / name).read_text())))
        return found
    return []


def prune(run_dir: Path, attempt: int) -> None:
    """Remove the records of every attempt but ``attempt``."""
    with contextlib.suppress(OSError):
        for name in os.listdir(run_dir / DIR):
            match = _NAME.match(name)
            if match and int(match[1]) != attempt:
                with contextlib.suppress(OSError):
                    os.unlink(run_dir / DIR / name)


def root_cause(own: FailureRecord, others: list[FailureRecord]) -> FailureRecord:
    """What this rank reports: its own failure, unless that is a communication error and a peer recorded
    another class (the earliest peer's own failure wins), taken as this rank's record."""
    if own.failure is not FailureClass.COMMUNICATION:
        return own
    causes = [r for r in others if r.failure is not FailureClass.COMMUNICATION]
    if not causes:
        return own
    first = min(causes, key=lambda r: (not r.original, r.time))
    return replace(first, rank=own.rank, time=own.time)


def await_root_cause(
    run_dir: Path, own: FailureRecord, world_size: int, wait: float = PEER_WAIT_SECONDS, poll: float = 0.1
) -> FailureRecord:
    """:func:`root_cause` of ``own`` and the peers' records, waiting up to ``wait`` seconds for one that
    changes it while some peer has written none (a killed peer never writes: then ``own`` stands)."""
    deadline = time.monotonic() + wait
    while True:
        others = [r for r in read(run_dir, own.attempt) if r.rank != own.rank]
        decided = root_cause(own, others)
        if decided != own or len({r.rank for r in others}) >= world_size - 1 or time.monotonic() >= deadline:
            return decided
        time.sleep(poll)
