"""When a rank is a straggler: a pure :class:`Rule` over the ranks' seconds per step by part, by window."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

#: What a rank does on its own in a step: the parts a straggler can be slow in.
PARTS = ("data", "compute", "optimizer")
#: Every part a rank reports, in words.
LABELS = {
    "data": "data wait",
    "compute": "compute",
    "collective": "collective wait",
    "optimizer": "optimizer step",
}


@dataclass(frozen=True)
class RankTimes:
    """One rank's seconds per step in one window, by part (``None``: not measured in that window)."""

    data: float | None = None
    compute: float | None = None
    collective: float | None = None
    optimizer: float | None = None


@dataclass(frozen=True)
class Rule:
    """A rank is slow when one of its :data:`PARTS` exceeds the others' median by over ``threshold`` times it
    and ``floor`` seconds, and named once slow ``patience`` windows in a row."""

    threshold: float
    floor: float
    patience: int


@dataclass(frozen=True)
class Slow:
    """A rank slower than the others in one window, in the part where it exceeds their median the most."""

    rank: int
    part: str
    seconds: float  # its seconds per step in that part
    median: float  # the median of the other ranks' seconds per step in that part


@dataclass(frozen=True)
class Straggler:
    """A rank :class:`~lightning_resume.StragglerDetector` named: what is slow, by how much, and where.

    Handed to ``StragglerDetector(on_straggler=...)`` and recorded in ``attempts.json``.

    Attributes:
        rank: Its global rank.
        host: The host (node) it runs on.
        part: What is slow: ``"data"`` (waiting for the next batch), ``"compute"`` (forward and
            backward) or ``"optimizer"`` (the optimizer step).
        seconds: Its seconds per step in that part, in the window it was named in.
        median: The median of the other ranks' seconds per step in that part.
        windows: How many windows in a row it was slow.
        step: The global step at which it was named.
        waited: Its seconds per step waiting in the backward's collectives (a straggler waits least;
            ``None``: not measured).
        others_waited: The median of the other ranks' (``None``: not measured).

    Example::

        def exclude(straggler: Straggler) -> None:
            Path("exclude_nodes.txt").open("a").write(straggler.host + "\\n")
    """

    rank: int
    host: str
    part: str
    seconds: float
    median: float
    windows: int
    step: int
    waited: float | None = None
    others_waited: float | None = None

    def describe(self) -> str:
        """One line: ``rank 3 on node gpu-017: data wait 150 ms per step vs median 10 ms, 3 windows``."""
        slow = (
            f"{LABELS[self.part]} {milliseconds(self.seconds)} per step vs median {milliseconds(self.median)}"
        )
        return f"rank {self.rank} on node {self.host}: {slow}, {self.windows} windows"

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Straggler:
        """A :class:`Straggler` from :meth:`to_dict`'s object (unknown keys are ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def milliseconds(seconds: float | None) -> str:
    """``150 ms``, ``2.5 ms``, ``0.04 ms``; ``-`` for ``None``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms" if ms >= 0.1 else f"{ms:.2f} ms"


def median_without(ordered: Sequence[float], index: int) -> float:
    """The median of sorted ``ordered`` without its element at ``index`` (at least two elements)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < index else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _measured(window: Sequence[RankTimes], part: str) -> list[tuple[float, int]]:
    """``(seconds, rank)`` of the ranks that measured ``part``, in increasing order."""
    values = ((getattr(times, part), rank) for rank, times in enumerate(window))
    return sorted((v, rank) for v, rank in values if v is not None and math.isfinite(v))


def slow_ranks(window: Sequence[RankTimes], rule: Rule) -> dict[int, Slow]:
    """The ranks slower than the others in ``window`` (``window[r]``: rank r's times), by rank."""
    found: dict[int, Slow] = {}
    for part in PARTS:
        measured = _measured(window, part)
        if len(measured) < 2:
            continue
        ordered = [seconds for seconds, _ in measured]
        for index, (seconds, rank) in enumerate(measured):
            median = median_without(ordered, index)
            if seconds - median <= max(rule.threshold * median, rule.floor):
                continue
            earlier = found.get(rank)
            if earlier is None or seconds - median > earlier.seconds - earlier.median:
                found[rank] = Slow(rank, part, seconds, median)
    return found


def advance(
    streaks: Mapping[int, int], window: Sequence[RankTimes], rule: Rule
) -> tuple[dict[int, int], list[tuple[Slow, int]]]:
    """The streaks (windows slow in a row) after ``window``, and the ranks whose streak reaches patience."""
    slow = slow_ranks(window, rule)
    after = {rank: streaks.get(rank, 0) + 1 for rank in slow}
    due = [(found, after[rank]) for rank, found in sorted(slow.items()) if after[rank] >= rule.patience]
    return after, due


def waits(window: Sequence[RankTimes], rank: int) -> tuple[float | None, float | None]:
    """Rank ``rank``'s collective wait in ``window`` and the median of the other ranks' (``None``: none)."""
    others = [seconds for seconds, other in _measured(window, "collective") if other != rank]
    return window[rank].collective, statistics.median(others) if others else None


def named(slow: Slow, host: str, windows: int, step: int, window: Sequence[RankTimes]) -> Straggler:
    """``slow`` named at ``step``, with its collective wait in ``window`` and the other ranks' median."""
    waited, others_waited = waits(window, slow.rank)
    return Straggler(
        slow.rank, host, slow.part, slow.seconds, slow.median, windows, step, waited, others_waited
    )
