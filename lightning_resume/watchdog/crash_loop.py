"""The crash-loop rule: attempts in a row that ended badly without a new durable checkpoint
(``ProgressWatchdog`` stops at ``max_attempts_without_progress``; ``reset-crash-loop`` resets)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lightning_resume.run_dir.attempts import Attempt, Cause, History

#: Endings that break a crash loop: the job did nothing wrong.
STREAK_BREAKERS = frozenset({Cause.FINISHED, Cause.PREEMPTED})


def without_progress(history: History, before: int | None = None) -> list[Attempt]:
    """The latest attempts in a row (before ``before``) that ended badly without a new checkpoint; a
    ``finished``/``preempted`` attempt, a checkpoint or a reset ends the streak (open records: killed)."""
    streak: list[Attempt] = []
    for attempt in reversed(history.attempts):
        if before is not None and attempt.number >= before:
            continue
        if attempt.number <= history.reset_after:
            break
        cause = attempt.end.cause if attempt.end is not None else Cause.KILLED
        if cause in STREAK_BREAKERS or attempt.made_progress:
            break
        streak.append(attempt)
    return streak[::-1]


def describe_streak(streak: Sequence[Attempt]) -> str:
    """The steps the attempts reached and how the last one ended, in one line."""
    first, last = streak[0], streak[-1]
    start = first.checkpoint_at_start.step if first.checkpoint_at_start else None
    reached = ", ".join("?" if a.last_step is None else str(a.last_step) for a in streak)
    where = "from the start" if start is None else f"from step {start}"
    how = last.end.detail if last.end is not None and last.end.detail else "ended without a word (killed?)"
    return (
        f"attempts {first.number}-{last.number} started {where} and reached step(s) {reached} without a "
        f"new durable checkpoint; the last one {how}"
    )


def reset(history: History) -> History:
    """``history`` with the crash-loop count starting after its last attempt."""
    last = history.last
    return replace(history, reset_after=last.number if last is not None else history.earlier.attempts)
