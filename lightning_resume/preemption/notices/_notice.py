"""``Notice``: what a notice source says (who, what, when), and the time formats the sources use."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

#: The kind of a notice that is a known end (a job's time limit), not a warning.
TIME_LIMIT = "time-limit"


@dataclass(frozen=True)
class Notice:
    """A warning that this machine or job is about to be stopped.

    Attributes:
        source: The source's name: ``"aws-spot"``, ``"gce"``, ``"azure"``, ``"slurm-time-limit"``, ``"file"``.
        kind: What will happen, in the source's words: ``"terminate"``, ``"stop"``, ``"hibernate"`` (AWS),
            ``"preempted"``, ``"TERMINATE_ON_HOST_MAINTENANCE"`` (GCE), ``"Preempt"``, ``"Terminate"``
            (Azure), ``"time-limit"`` (SLURM), ``"file"``.
        deadline: When it happens, as wall-clock time (seconds since the epoch, as ``time.time()``);
            ``None`` when the source does not say.
        detail: What the source answered, for the log.
        received: When the notice was first seen (``time.time()``).

    Example::

        notice = AwsSpotNotice().poll()
        if notice is not None and notice.deadline is not None:
            print(f"{notice.source}: {notice.kind} in {notice.deadline - time.time():.0f} s")
    """

    source: str
    kind: str
    deadline: float | None
    detail: str = ""
    received: float = 0.0

    @property
    def is_time_limit(self) -> bool:
        """A known end (the job's time limit), not a warning: nothing is saved before it is due."""
        return self.kind == TIME_LIMIT

    def describe(self) -> str:
        """One phrase for a log line: ``aws-spot (terminate, deadline 2026-05-01T12:00:00Z)``."""
        deadline = f"deadline {format_time(self.deadline)}" if self.deadline is not None else "no deadline"
        return f"{self.source} ({self.kind}, {deadline})"


def format_time(seconds: float) -> str:
    """``2026-05-01T12:00:00Z``: a wall-clock time in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def parse_iso_time(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 time such as ``2026-05-01T12:00:00Z`` (no zone: UTC)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"  # Python < 3.11 does not read "Z"
    stamp = datetime.fromisoformat(value)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def parse_http_time(text: str) -> float:
    """Seconds since the epoch of an RFC 1123 time such as ``Mon, 19 Sep 2016 18:29:47 GMT`` (Azure)."""
    try:
        stamp = parsedate_to_datetime(text.strip())
    except (TypeError, IndexError) as e:  # what older Pythons raise for text that is no date
        raise ValueError(f"not an RFC 1123 time: {text!r}") from e
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def parse_local_time(text: str) -> float:
    """Seconds since the epoch of ``2026-05-01T12:00:00`` in the local time zone (how ``scontrol`` prints)."""
    return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))


def parse_deadline(text: str) -> float | None:
    """A notice file's deadline: seconds since the epoch, an ISO 8601 time, or ``None`` for an empty text."""
    value = text.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return parse_iso_time(value)
    if not math.isfinite(seconds):
        raise ValueError(f"not a time: {value!r}")
    return seconds
