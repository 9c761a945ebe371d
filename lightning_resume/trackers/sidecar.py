"""Tracker resume sidecars: pure functions over a run dir and plain dicts.

A sidecar is ``<run dir>/<tracker>_resume.json``: the identity of the tracker run that the run dir
logs to, and the environment variables that decided where that run went, written atomically by
rank 0 once the run exists and again at every checkpoint::

    {"format": 1, "tracker": "wandb", "global_step": 120, "written": "2026-01-01T12:00:00+00:00",
     "identity": {"id": "3kx9a2", "project": "mnist", "entity": "lab", "name": null,
                  "mode": "offline", "dir": "/scratch/me"},
     "environment": {"WANDB_PROJECT": null, "WANDB_ENTITY": "lab", "WANDB_MODE": "offline"}}

A restart reads it back before the tracker creates a run, checks that the run about to be created
goes to the same place, and only then hands the identity back to the tracker.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import write_json_atomic

FORMAT = 1
SUFFIX = "_resume.json"
# Identity fields that are paths: compared after resolving, so "./logs" and "/abs/logs" are one place.
PATH_FIELDS = frozenset({"dir"})

Conflict = tuple[str, Any, Any]


@dataclass(frozen=True)
class Sidecar:
    """What a sidecar records.

    Attributes:
        identity: The tracker run (id, project, ...); ``None`` values mean "not known".
        environment: The tracker's placement environment variables when the run was created
            (``None`` for unset ones).
        global_step: The trainer's global step at the last write.
    """

    identity: dict[str, Any]
    environment: dict[str, str | None] = field(default_factory=dict)
    global_step: int = 0


def sidecar_path(run_dir: str | Path, tracker: str) -> Path:
    """Where the sidecar of ``tracker`` lives in ``run_dir``."""
    return Path(run_dir) / f"{tracker}{SUFFIX}"


def write_sidecar(path: str | Path, tracker: str, sidecar: Sidecar) -> None:
    """Write ``sidecar`` atomically: a reader sees the previous file or this one, never a torn one."""
    write_json_atomic(
        path,
        {
            "format": FORMAT,
            "tracker": tracker,
            "global_step": int(sidecar.global_step),
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "identity": dict(sidecar.identity),
            "environment": dict(sidecar.environment),
        },
    )


def read_sidecar(path: str | Path, tracker: str, required: Iterable[str] = ("id",)) -> Sidecar | None:
    """Read a sidecar back; ``None`` when there is none.

    Args:
        path: The sidecar file.
        tracker: The tracker the sidecar must belong to.
        required: Identity fields that must be non-empty strings.

    Raises:
        ValueError: the file exists but cannot be read, is not JSON, belongs to another tracker or
            lacks a required field. The message says which.

    Example::

        sidecar = read_sidecar(sidecar_path(run_dir, "wandb"), "wandb")
        run_id = sidecar.identity["id"] if sidecar else None
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {str(path)!r}: {e}") from e
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{str(path)!r} is not valid JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("identity"), dict):
        raise ValueError(f"{str(path)!r} has no 'identity' object")
    if data.get("tracker") != tracker:
        raise ValueError(f"{str(path)!r} belongs to tracker {data.get('tracker')!r}, not {tracker!r}")
    identity: dict[str, Any] = data["identity"]
    for name in required:
        value = identity.get(name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{str(path)!r} has no usable {name!r} (found {value!r})")
    environment = data.get("environment")
    step = data.get("global_step")
    return Sidecar(
        identity,
        {str(k): None if v is None else str(v) for k, v in environment.items()}
        if isinstance(environment, dict)
        else {},
        step if isinstance(step, int) else 0,
    )


def _same(name: str, left: Any, right: Any) -> bool:
    if left in (None, "") or right in (None, ""):
        return left in (None, "") and right in (None, "")
    if name in PATH_FIELDS:
        return Path(str(left)).expanduser().resolve() == Path(str(right)).expanduser().resolve()
    return str(left) == str(right)


def place_conflicts(
    recorded: Mapping[str, Any], now: Mapping[str, Any], fields: Iterable[str], known_only: bool = True
) -> list[Conflict]:
    """The ``(field, recorded, now)`` triples where a run would go somewhere else than the recorded one.

    Args:
        recorded: The recorded identity.
        now: The same fields for the run about to be created (or just created).
        fields: The fields that say where a run lives (project, entity, mode, storage dir, ...).
        known_only: Compare a field only when both sides have a value: what cannot be known before
            the tracker creates its run is not a conflict. ``False`` compares every field.
    """
    return [
        (name, recorded.get(name), now.get(name))
        for name in fields
        if not (known_only and (recorded.get(name) in (None, "") or now.get(name) in (None, "")))
        and not _same(name, recorded.get(name), now.get(name))
    ]


def environment_conflicts(
    recorded: Mapping[str, str | None], now: Mapping[str, str | None]
) -> list[Conflict]:
    """Placement variables that changed since the run was created (variables not recorded are skipped)."""
    return [(name, recorded[name], now.get(name)) for name in recorded if recorded[name] != now.get(name)]


def describe(conflicts: Iterable[Conflict]) -> str:
    """``project 'a' (recorded) vs 'b' (now), ...`` for messages."""
    return ", ".join(f"{name} {then!r} (recorded) vs {now!r} (now)" for name, then, now in conflicts)


class Recorded(enum.Enum):
    """What a restart found in a tracker sidecar."""

    #: No sidecar: the first attempt never created a tracker run (or it was deleted).
    MISSING = "missing"
    #: A sidecar that cannot be used (see :attr:`RecordedRun.error`).
    UNREADABLE = "unreadable"
    #: The run would now be created somewhere else (see :attr:`RecordedRun.conflicts`).
    ELSEWHERE = "elsewhere"
    #: The recorded run can be continued.
    CONTINUABLE = "continuable"


@dataclass(frozen=True)
class RecordedRun:
    """The one check of a sidecar before a restart continues its tracker run.

    Attributes:
        found: The outcome.
        path: The sidecar file.
        sidecar: What it records (``None`` when missing or unreadable).
        conflicts: ``(field, recorded, now)`` triples that make the run go elsewhere.
        error: Why an unreadable sidecar cannot be used.
    """

    found: Recorded
    path: Path
    sidecar: Sidecar | None = None
    conflicts: list[Conflict] = field(default_factory=list)
    error: str = ""

    def refusal(self, tracker: str) -> str:
        """The sentence that says the recorded run is not continued because it would go elsewhere."""
        assert self.sidecar is not None
        return (
            f"not continuing {tracker} run {self.sidecar.identity['id']!r} recorded in {str(self.path)!r}: "
            f"this attempt is configured for another place ({describe(self.conflicts)}). {tracker} starts "
            "a new run there instead of writing into the recorded one; training still resumes from its "
            "checkpoint."
        )


def check_recorded(
    run_dir: str | Path,
    tracker: str,
    required: Iterable[str],
    now: Mapping[str, Any],
    fields: Iterable[str],
    environment: Mapping[str, str | None] | None = None,
    known_only: bool = True,
) -> RecordedRun:
    """Read ``tracker``'s sidecar in ``run_dir`` and check that its run would be continued in place.

    Args:
        run_dir: The run dir.
        tracker: The tracker's name.
        required: Identity fields a usable sidecar must have.
        now: The place fields of the run about to be created.
        fields: The identity fields that say where a run lives.
        environment: The tracker's placement variables now (compared with the recorded ones), if any.
        known_only: As for :func:`place_conflicts`.
    """
    path = sidecar_path(run_dir, tracker)
    try:
        recorded = read_sidecar(path, tracker, required)
    except ValueError as e:
        return RecordedRun(Recorded.UNREADABLE, path, error=str(e))
    if recorded is None:
        return RecordedRun(Recorded.MISSING, path)
    conflicts = place_conflicts(recorded.identity, now, fields, known_only=known_only)
    if environment is not None:
        conflicts += environment_conflicts(recorded.environment, environment)
    found = Recorded.ELSEWHERE if conflicts else Recorded.CONTINUABLE
    return RecordedRun(found, path, recorded, conflicts)
