"""What a notice asks for, decided from the notices, the clock and the measured time to durable. Pure."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

from lightning_resume.preemption.notices._notice import Notice

ON_NOTICE = ("save_and_continue", "stop")  # what PreemptionHandler(on_notice=...) accepts
#: Seconds from the start of a save until it is durable, assumed before any save was measured.
DEFAULT_SECONDS_TO_DURABLE = 30.0


class Act(enum.IntEnum):
    """What a rank wants done at a check. The ranks agree on the largest (a max all-reduce)."""

    NONE = 0
    #: A notice with room before its deadline: save ``last.ckpt`` now and train on.
    SAVE = 1
    #: A notice: save ``last.ckpt``, requeue and stop now.
    STOP = 2
    #: A preemption signal: save ``last.ckpt``, requeue and stop now.
    SIGNAL = 3


def stop_time(deadline: float, seconds_to_durable: float, margin: float) -> float:
    """The latest time the last save may start: the deadline less the time to durable and the margin."""
    return deadline - seconds_to_durable - margin


def expected_seconds_to_durable(*measured: float | None, recorded: float | None = None) -> float:
    """The longest time to durable measured in this attempt, else the run's ``recorded``, else the default."""
    known = [seconds for seconds in measured if seconds is not None]
    if known:
        return max(known)
    return recorded if recorded is not None else DEFAULT_SECONDS_TO_DURABLE


def decide(
    notices: Sequence[Notice],
    *,
    now: float,
    seconds_to_durable: float,
    margin: float,
    period: float,
    on_notice: str,
    saved: bool,
) -> tuple[Act, Notice | None]:
    """What the notices ask for at a check at ``now`` (``period``: until the next), and the notice asking."""
    warning: Notice | None = None
    for notice in sorted(notices, key=lambda n: n.deadline if n.deadline is not None else math.inf):
        # Waiting for the next check would start the last save too late for this deadline.
        if notice.deadline is not None and now + period >= stop_time(
            notice.deadline, seconds_to_durable, margin
        ):
            return Act.STOP, notice
        if warning is None and not notice.is_time_limit:  # a time limit asks for nothing before that
            warning = notice
    if warning is None:
        return Act.NONE, None
    if on_notice == "stop":
        return Act.STOP, warning
    if saved:
        return Act.NONE, None
    # A warning not yet saved for: save, unless there is no room for a save now and one more later.
    no_room = warning.deadline is not None and now + seconds_to_durable + period >= stop_time(
        warning.deadline, seconds_to_durable, margin
    )
    return (Act.STOP if no_room else Act.SAVE), warning
