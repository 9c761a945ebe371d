"""The failure classes and the exit status a scheduler reads for each: one table for the package and for
``lightning-resume doctor --emit``. Standard library only: the command line reads it without torch."""

from __future__ import annotations

import enum
from typing import NamedTuple


class _Row(NamedTuple):
    exit_code: int
    retryable: bool
    label: str  # in a sentence: "attempt 3 ended: out of memory on rank 1"
    what: str  # what falls in the class


class FailureClass(str, enum.Enum):
    """A class of failure, described by :attr:`exit_code`, :attr:`retryable`, :attr:`label`, :attr:`what`."""

    PREEMPTED = "preempted"
    HANG = "hang"
    COMMUNICATION = "communication"
    OUT_OF_MEMORY = "out-of-memory"
    NON_FINITE = "non-finite"
    DATA = "data"
    DO_NOT_RETRY = "do-not-retry"
    ERROR = "error"
    CRASH_LOOP = "crash-loop"

    @property
    def exit_code(self) -> int:
        """The process exit status of this class."""
        return TABLE[self].exit_code

    @property
    def retryable(self) -> bool:
        """Whether a retry can fix it: the scheduler should requeue on this status."""
        return TABLE[self].retryable

    @property
    def label(self) -> str:
        """The class in words (``"out of memory"``)."""
        return TABLE[self].label

    @property
    def what(self) -> str:
        """What falls in the class."""
        return TABLE[self].what


#: The table: exit status, whether a retry can fix it, its name in words, what falls in it. The statuses
#: avoid the shell's (1, 2, 126, 127) and 128+n but 143 ("terminated"); sysexits.h's where one fits.
TABLE: dict[FailureClass, _Row] = {
    FailureClass.PREEMPTED: _Row(143, True, "preempted", "a preemption signal or notice (PreemptionHandler)"),
    FailureClass.HANG: _Row(
        75, True, "hang", "a rank made no progress (ProgressWatchdog); sysexits' TEMPFAIL"
    ),
    FailureClass.COMMUNICATION: _Row(
        76,
        True,
        "communication error",
        "a collective timed out or failed: DistBackendError, gloo/NCCL timeouts, a peer's connection "
        "closed; sysexits' PROTOCOL",
    ),
    FailureClass.OUT_OF_MEMORY: _Row(
        71, True, "out of memory", "torch.OutOfMemoryError, CUDA or CPU allocator out of memory, MemoryError"
    ),
    FailureClass.NON_FINITE: _Row(
        65,
        False,
        "non-finite loss or gradients",
        "Trainer(detect_anomaly=True) finding NaN, FloatingPointError, a non-finite gradient norm; "
        "sysexits' DATAERR",
    ),
    FailureClass.DATA: _Row(
        66,
        False,
        "data loading error",
        "an exception raised by the dataset, a collate function or a DataLoader worker; sysexits' NOINPUT",
    ),
    FailureClass.DO_NOT_RETRY: _Row(
        78,
        False,
        "do not retry",
        "ResumeError, RunDirError, MisconfigurationException, or any other error before the attempt's "
        "first training step (bad configuration, a bug); sysexits' CONFIG",
    ),
    FailureClass.ERROR: _Row(
        70, False, "error", "any other exception, raised after the first training step; sysexits' SOFTWARE"
    ),
    FailureClass.CRASH_LOOP: _Row(
        93, False, "crash loop", "ProgressWatchdog stopped: the last attempts all failed without progress"
    ),
}


def exit_codes(retryable: bool) -> list[int]:
    """The exit statuses of the classes a retry can (or cannot) fix, in ascending order."""
    return sorted(row.exit_code for row in TABLE.values() if row.retryable is retryable)


def by_exit_code(code: int) -> FailureClass | None:
    """The class whose exit status is ``code`` (``None``: none)."""
    return next((failure for failure, row in TABLE.items() if row.exit_code == code), None)


def ending(failure: str, rank: int | None, exit_code: int | None, retried: bool = False) -> str:
    """An attempt's failure in words: ``"out of memory on rank 1, exit 71, retried"`` (``retried``: another
    attempt followed; else the words say whether the class is retryable)."""
    known = next((f for f in FailureClass if f.value == failure), None)
    text = (known.label if known is not None else failure) + (f" on rank {rank}" if rank is not None else "")
    text += f", exit {exit_code}" if exit_code is not None else ""
    if retried:
        return f"{text}, retried"
    return text if known is None else f"{text}, {'retryable' if known.retryable else 'not retryable'}"
