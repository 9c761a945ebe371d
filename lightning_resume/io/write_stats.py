"""How one checkpoint file was written: a record for logs, ``PreemptionHandler``'s stop line and "auto"."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
