"""How long each section of training may take before a rank counts as hung: given, or learned from
the slowest times seen, kept in ``<run dir>/watchdog.json`` with the settings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_resume._checks import positive_number
from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.hangs import Section

VERSION = 1


def _seconds(name: str, value: float | None) -> float | None:
    return None if value is None else positive_number(name, value, "number of seconds or None")


@dataclass(frozen=True)
class WatchdogTimeouts:
    """How long each section of training may take before :class:`~lightning_resume.ProgressWatchdog`
    takes a rank for hung: fixed seconds, or learned (``None``): ``multiple`` times the slowest time
    seen, never below ``minimum``, ``initial`` while none was seen.

    Args:
        step: Seconds a training step (with fetching its batch) may take.
        first_step: Seconds from the callback's construction (or ``setup``) to the end of the first
            step, less the load and the sanity check (compilation, data warm-up).
        validation: Seconds one validation batch may take.
        epoch_end: Seconds from an epoch's last step to the next one's first, validation and saves
            excepted.
        save: Seconds a checkpoint save may hold training (waits until durable included).
        load: Seconds a restart may take to load its checkpoint.
        teardown: Seconds the end of ``fit`` may take (the last save's wait, teardown hooks).
        multiple: A learned timeout is this many times the slowest time seen (at least 1).
        minimum: A learned timeout is never below this many seconds.
        initial: Seconds allowed to a section never seen before (the first start-up, validation...).

    Raises:
        TypeError: for a value of the wrong type.
        ValueError: for a timeout that is not positive, or a multiple below 1.

    Example::

        ProgressWatchdog(timeouts=WatchdogTimeouts(step=600, save=1800))
    """

    step: float | None = None
    first_step: float | None = None
    validation: float | None = None
    epoch_end: float | None = None
    save: float | None = None
    load: float | None = None
    teardown: float | None = None
    multiple: float = 5.0
    minimum: float = 300.0
    initial: float = 1800.0

    def __post_init__(self) -> None:
        for name in _FIELDS.values():
            object.__setattr__(self, name, _seconds(f"WatchdogTimeouts({name}=...)", getattr(self, name)))
        multiple = positive_number("WatchdogTimeouts(multiple=...)", self.multiple)
        if multiple < 1:
            raise ValueError(
                f"WatchdogTimeouts(multiple=...) must be >= 1, got {self.multiple!r}: a timeout below the "
                "slowest time seen would end healthy ranks."
            )
        object.__setattr__(self, "multiple", multiple)
        object.__setattr__(self, "minimum", positive_number("WatchdogTimeouts(minimum=...)", self.minimum))
        object.__setattr__(self, "initial", positive_number("WatchdogTimeouts(initial=...)", self.initial))

    @property
    def fixed(self) -> dict[Section, float]:
        """The timeouts given, by section (never learned)."""
        found = {section: getattr(self, name) for section, name in _FIELDS.items()}
        return {section: value for section, value in found.items() if value is not None}


#: The field of :class:`WatchdogTimeouts` that fixes each section's timeout.
_FIELDS = {
    Section.STEP: "step",
    Section.STARTUP: "first_step",
    Section.VALIDATION: "validation",
    Section.EPOCH_END: "epoch_end",
    Section.SAVE: "save",
    Section.LOAD: "load",
    Section.TEARDOWN: "teardown",
}


class Timeouts:
    """The slowest time seen per section, and the timeout each section has now."""

    def __init__(self, settings: WatchdogTimeouts, slowest: Mapping[Section, float] | None = None) -> None:
        self.settings = settings
        self.slowest: dict[Section, float] = dict(slowest or {})

    def timeout(self, section: Section) -> float:
        fixed = self.settings.fixed.get(section)
        if fixed is not None:
            return fixed
        seen = self.slowest.get(section)
        if seen is None:
            return self.settings.initial
        return max(self.settings.minimum, self.settings.multiple * seen)

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
            "min_timeout": settings.minimum,
            "initial_timeout": settings.initial,
            "max_attempts_without_progress": crash_loop_limit,
        },
    )
