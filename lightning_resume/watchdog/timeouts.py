"""The sections a rank goes through, and how long each may take before the rank counts as hung.

A section's timeout is the one the user gave, or ``multiple`` times the slowest time seen for it
(never below ``min_timeout``), or ``initial_timeout`` while nothing was seen. The slowest times are kept
in ``<run dir>/watchdog.json`` so that the next attempt starts with them; the file also records the
settings, for ``lightning-resume inspect`` and ``doctor``.

Pure standard library.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.run_dir import layout

VERSION = 1


class Section(str, enum.Enum):
    """Where a rank is; each section has its own timeout."""

    #: From the callback's construction to the end of the first training step (DDP set-up, data,
    #: compilation), less the checkpoint load and the sanity check.
    STARTUP = "startup"
    #: One training step, with fetching its batch.
    STEP = "step"
    #: One validation batch (the sanity check's too).
    VALIDATION = "validation"
    #: From an epoch's last step to the next epoch's first (epoch-end hooks, new iterators).
    EPOCH_END = "epoch_end"
    #: A checkpoint save, until training goes on (a wait until it is durable included).
    SAVE = "save"
    #: Loading the checkpoint a restart resumes from.
    LOAD = "load"
    #: After training: the final save's wait, teardown hooks; after an error, Lightning's clean-up.
    TEARDOWN = "teardown"

    @property
    def label(self) -> str:
        """The section as people read it (``"training step"``)."""
        return LABELS[self.value]


LABELS = {
    "startup": "start-up",
    "step": "training step",
    "validation": "validation",
    "epoch_end": "epoch end",
    "save": "checkpoint save",
    "load": "checkpoint load",
    "teardown": "teardown",
}


def section_label(value: str | None) -> str:
    """A section value (``"step"``) as people read it; unknown values as they are."""
    return LABELS.get(value or "", value or "unknown section")


@dataclass(frozen=True)
class Settings:
    """How timeouts are chosen.

    Attributes:
        fixed: The timeouts the user gave, by section (never learned).
        multiple: A learned timeout is this many times the slowest time seen.
        min_timeout: A learned timeout is never below this (seconds).
        initial_timeout: The timeout of a section never seen yet (seconds).
    """

    fixed: Mapping[Section, float] = field(default_factory=dict)
    multiple: float = 5.0
    min_timeout: float = 300.0
    initial_timeout: float = 1800.0


class Timeouts:
    """The slowest time seen per section, and the timeout each section has now.

    Example::

        timeouts = Timeouts(Settings(min_timeout=2.0))
        timeouts.observe(Section.STEP, 0.4)
        timeouts.timeout(Section.STEP)  # 2.0 (5 x 0.4 is below the floor)
    """

    def __init__(self, settings: Settings, slowest: Mapping[Section, float] | None = None) -> None:
        self.settings = settings
        self.slowest: dict[Section, float] = dict(slowest or {})

    def timeout(self, section: Section) -> float:
        """Seconds ``section`` may take now."""
        fixed = self.settings.fixed.get(section)
        if fixed is not None:
            return fixed
        seen = self.slowest.get(section)
        if seen is None:
            return self.settings.initial_timeout
        return max(self.settings.min_timeout, self.settings.multiple * seen)

    def observe(self, section: Section, seconds: float) -> bool:
        """Count a completed ``section`` that took ``seconds``; whether it is the slowest yet."""
        if seconds <= self.slowest.get(section, -1.0):
            return False
        self.slowest[section] = seconds
        return True

    def merge(self, slowest: Mapping[Section, float]) -> None:
        """Take the slower of each section's time here and in ``slowest`` (an earlier attempt's)."""
        for section, seconds in slowest.items():
            self.observe(section, seconds)


def read_slowest(run_dir: Path) -> dict[Section, float]:
    """The slowest section times ``watchdog.json`` holds (empty when missing or unreadable)."""
    data = read(run_dir)
    found: dict[Section, float] = {}
    for key, value in (data.get("slowest") or {}).items():
        try:
            found[Section(key)] = float(value)
        except (ValueError, TypeError):
            continue  # a section of a newer version, or a bad value: the rest still counts
    return found


def read(run_dir: Path) -> dict[str, Any]:
    """``watchdog.json`` as written (empty when missing or unreadable)."""
    try:
        data = json.loads((run_dir / layout.WATCHDOG).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(run_dir: Path, timeouts: Timeouts, crash_loop_limit: int) -> None:
    """Record the slowest times, the timeouts that follow and the settings in ``watchdog.json``."""
    settings = timeouts.settings
    write_json_atomic(
        run_dir / layout.WATCHDOG,
        {
            "version": VERSION,
            "slowest": {s.value: round(v, 3) for s, v in timeouts.slowest.items()},
            "timeouts": {s.value: round(timeouts.timeout(s), 3) for s in Section},
            "fixed": {s.value: v for s, v in settings.fixed.items()},
            "multiple": settings.multiple,
            "min_timeout": settings.min_timeout,
            "initial_timeout": settings.initial_timeout,
            "max_attempts_without_progress": crash_loop_limit,
        },
    )
