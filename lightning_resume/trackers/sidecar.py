"""Tracker resume sidecars, ``<run dir>/<tracker>_resume.json``: the run logged to (``identity``) and the
variables that placed it (``environment``, ``None``: unset); and their check before a restart continues it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume._warnings import warn
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.resolve import Resolution

log = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = "_resume.json"

Conflict = tuple[str, Any, Any]


@dataclass(frozen=True)
class Sidecar:
    """A sidecar's run ``identity``, placement ``environment`` and ``global_step`` at the last write."""

    identity: dict[str, Any]
    environment: dict[str, str | None] = field(default_factory=dict)
    global_step: int = 0


def sidecar_path(run_dir: str | Path, tracker: str) -> Path:
    return Path(run_dir) / f"{tracker}{SUFFIX}"


def write_sidecar(path: str | Path, tracker: str, sidecar: Sidecar) -> None:
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
    """A sidecar (``None``: there is none); ``ValueError`` when it is unreadable, not JSON, another
    tracker's or lacks a ``required`` identity field (a non-empty string)."""
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
    environment = environment if isinstance(environment, dict) else {}
    step = data.get("global_step")
    env = {str(k): None if v is None else str(v) for k, v in environment.items()}
    return Sidecar(identity, env, step if isinstance(step, int) else 0)


def _same(name: str, left: Any, right: Any) -> bool:
    if left in (None, "") or right in (None, ""):
        return left in (None, "") and right in (None, "")
    if name == "dir":  # a path: compared resolved
        return Path(str(left)).expanduser().resolve() == Path(str(right)).expanduser().resolve()
    return str(left) == str(right)


def place_conflicts(
    recorded: Mapping[str, Any], now: Mapping[str, Any], fields: Iterable[str], known_only: bool = True
) -> list[Conflict]:
    """The ``(field, recorded, now)`` triples of ``fields`` where the run ``now`` goes elsewhere; with
    ``known_only``, a field empty on either side (not known before the run exists) is no conflict."""
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


@dataclass(frozen=True)
class RecordedRun:
    """The one check of a sidecar before a restart continues its tracker run: unreadable (``error``),
    missing (no ``sidecar``), configured for another place (``conflicts``) or continuable."""

    path: Path
    sidecar: Sidecar | None = None
    conflicts: list[Conflict] = field(default_factory=list)
    error: str = ""

    def refusal(self, tracker: str) -> str:
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
    """Read ``tracker``'s sidecar in ``run_dir`` and check that its run would be continued in place:
    ``now``'s ``fields`` (see :func:`place_conflicts`) and the placement ``environment``, if given."""
    path = sidecar_path(run_dir, tracker)
    try:
        recorded = read_sidecar(path, tracker, required)
    except ValueError as e:
        return RecordedRun(path, error=str(e))
    if recorded is None:
        return RecordedRun(path)
    conflicts = place_conflicts(recorded.identity, now, fields, known_only=known_only)
    if environment is not None:
        conflicts += environment_conflicts(recorded.environment, environment)
    return RecordedRun(path, recorded, conflicts)


def to_continue(
    tracker: str,
    required: Iterable[str],
    now: Callable[[], Mapping[str, Any]],
    fields: Iterable[str],
    who: str,
    stacklevel: int,
) -> tuple[Resolution, Path, dict[str, Any]] | None:
    """For a logger (``who``) continuing its recorded run itself: the restart, sidecar and identity, or
    ``None`` (no restart or usable sidecar, or elsewhere: warned); ``now`` is asked on a restart only."""
    resolution = PROCESS.current
    if resolution is None or not resolution.is_resumed:
        return None
    check = check_recorded(resolution.path, tracker, required, now(), fields, known_only=False)
    if check.error:
        log.debug("not resuming from %s: %s", check.path, check.error)  # the resume callback warns about it
    elif check.conflicts:
        warn(f"{who}: {check.refusal(tracker)}", all_ranks=True, stacklevel=stacklevel + 1)
    elif check.sidecar is not None:
        return resolution, check.path, check.sidecar.identity
    return None
