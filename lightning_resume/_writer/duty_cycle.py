"""Two speeds for the checkpoint writer: gentle in the background, full speed once the trainer waits.

A gentle write works for about 50 ms, waits for the disk, then rests ``(1 - share) / share`` times as
long. Not a nice value: a niced process cannot be un-niced without privileges, and it starves on a busy
node just when a preemption needs it. The trainer lifts the pacing through a pipe (:func:`hurry`)."""

from __future__ import annotations

import contextlib
import math
import os
import select
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

QUANTUM = 0.05  #: seconds of work between two rests of a gentle write
_MESSAGE = 8  # bytes per hurry message: a little-endian sequence number


@dataclass(frozen=True)
class WriteStats:
    """How one checkpoint file was written (``DurableCheckpointIO.last_write``).

    Attributes:
        nbytes: Size of the file.
        seconds: From the start of the write until the file and its manifest were committed.
        fsync_seconds: Of which the fsync of the data file.
        share: The background share the write started with (1.0: full speed).
        hurried_after: Bytes written gently before a wait switched it to full speed (``None``: never).
        rested_seconds: Time spent resting in the duty cycle.
    """

    nbytes: int
    seconds: float
    fsync_seconds: float = 0.0
    share: float = 1.0
    hurried_after: int | None = None
    rested_seconds: float = 0.0

    @property
    def bytes_per_second(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else math.inf

    def describe(self) -> str:
        """One phrase for a log line: ``written in 1.234 s, 1.07 GB at 870 MB/s``."""
        speed = f"{self.bytes_per_second / 1e6:,.0f} MB/s" if self.seconds > 0 else "no measurable time"
        return f"written in {self.seconds:.3f} s, {self.nbytes / 1e9:.2f} GB at {speed}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WriteStats:
        return cls(**data)


def hurry(fd: int, seq: int) -> None:
    """Ask the writer reading the pipe ``fd`` to finish write ``seq`` at full speed; never blocks."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, seq.to_bytes(_MESSAGE, "little"))


class DutyCycle:
    """Paces one write (working ``share`` of the time) until a hurry message or the trainer's exit."""

    def __init__(
        self, share: float = 1.0, hurry_fd: int | None = None, seq: int = 0, quantum: float = QUANTUM
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be within (0, 1], got {share!r}.")
        self.share = share
        self.gentle = share < 1
        self.hurried_after: int | None = None
        self.rested = 0.0
        self.fsync_seconds = 0.0
        self._hurry_fd = hurry_fd
        self._seq = seq
        self._quantum = quantum
        self._handed = 0
        self._start = self._period = time.monotonic()

    def after_block(self, nbytes: int, drain: Callable[[], None]) -> None:
        """``nbytes`` more were handed to the disk; rest if this work period is over."""
        self._handed += nbytes
        if not self.gentle or self._hurried(0.0) or time.monotonic() - self._period < self._quantum:
            return
        drain()  # the rest must be a rest of the disk too
        worked = time.monotonic() - self._period
        self._rest(worked * (1 - self.share) / self.share)
        self._period = time.monotonic()

    def stats(self, nbytes: int) -> WriteStats:
        seconds = time.monotonic() - self._start
        return WriteStats(nbytes, seconds, self.fsync_seconds, self.share, self.hurried_after, self.rested)

    def _rest(self, seconds: float) -> None:
        start = time.monotonic()
        deadline = start + seconds
        while self.gentle and (left := deadline - time.monotonic()) > 0:
            self._hurried(left)
        self.rested += time.monotonic() - start

    def _hurried(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a hurry message; whether the write is at full speed now."""
        if self._hurry_fd is None:
            if timeout > 0:
                time.sleep(timeout)
            return not self.gentle
        if select.select([self._hurry_fd], [], [], timeout)[0]:
            try:
                data = os.read(self._hurry_fd, 512 * _MESSAGE)
            except BlockingIOError:
                data = None
            if data == b"":  # the trainer is gone: nobody to be gentle with, and the save must land
                self._full_speed()
            elif data:
                starts = range(0, len(data), _MESSAGE)
                if max(int.from_bytes(data[i : i + _MESSAGE], "little") for i in starts) >= self._seq:
                    self._full_speed()
        return not self.gentle

    def _full_speed(self) -> None:
        if self.gentle:
            self.gentle = False
            self.hurried_after = self._handed
