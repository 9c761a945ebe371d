"""``lightning-resume gc``: find index entries, handoff files and save leftovers nothing will need again."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from lightning_resume._storage.commit import retention, stale
from lightning_resume._storage.kinds import DIRECTORY, resolve_pointer
from lightning_resume._storage.store import LocalStore
from lightning_resume.run_dir import handoff, layout
from lightning_resume.run_dir.owner import in_use, is_gone
from lightning_resume.run_dir.resolve import index_entries
from lightning_resume.run_dir.status import RunStatus, read_status

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` -> seconds; ``ValueError`` for anything else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise ValueError(f"expected an age such as 30d, 12h, 90m, 45s or 2w, got {text!r}")
    return float(match[1]) * _UNITS[match[2]]


@dataclass(frozen=True)
class Removal:
    path: str
    kind: str
    reason: str


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def _status_age(run_dir: Path, now: float) -> float | None:
    """Seconds since a run finished (from status.json), or ``None`` if it is not known to have finished."""
    status = read_status(run_dir)
    if status.get("status") != RunStatus.FINISHED.value:
        return None
    try:
        return now - datetime.fromisoformat(str(status["time"])).timestamp()
    except (KeyError, ValueError):
        return _age(run_dir / layout.STATUS, now)


def checkpoint_leftovers(folder: Path, older_than: float, now: float) -> list[Removal]:
    """Save leftovers, unreadable checkpoint dirs ``last.ckpt`` does not name, older than ``older_than``."""
    # stale() spares the leftovers of a process running on this machine (a writer outliving its trainer).
    leftovers = [(name, "leftover", "an interrupted save") for name in stale(folder)]
    target = resolve_pointer(folder / layout.LAST_CKPT)
    # What retention would remove without a count limit: directories that no longer count.
    unreadable = retention(LocalStore(folder), DIRECTORY, None, target.name if target else None)
    leftovers += [(name, "checkpoint directory", "no readable manifest: never loaded") for name in unreadable]
    return [
        Removal(str(folder / n), kind, why)
        for n, kind, why in leftovers
        if _age(folder / n, now) > older_than
    ]


#: A handoff file whose writer may still live (on another host, say) is kept at least this long.
HANDOFF_LIFETIME = 86400.0


def plan(root: Path, older_than: float, now: float | None = None) -> list[Removal]:
    """What ``gc`` removes, older than ``older_than`` seconds: index entries of finished or missing runs,
    handoff files whose writer is gone (else a day old), save leftovers; nothing a run in use needs."""
    now = time.time() if now is None else now
    removals = []
    for entry in index_entries(root):
        target = entry.target
        if target is None:
            continue  # unreadable: a restart would stop on it with a clear error; leave it to the user
        if not target.is_dir():
            if _age(entry.path, now) > older_than:
                removals.append(Removal(str(entry.path), "index", f"points at missing {target}"))
            continue
        finished = _status_age(target, now)
        if finished is not None and finished > older_than and not in_use(target):
            why = f"run {target.name} finished {finished / 86400:.1f} days ago"
            removals.append(Removal(str(entry.path), "index", why))
    folder = root / layout.HANDOFF_DIR
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not path.is_file() or path.is_symlink():
            continue  # handoffs are plain files; anything else is not ours to remove
        age = _age(path, now)
        if age > older_than and (age > HANDOFF_LIFETIME or is_gone(handoff.writer_of(path))):
            removals.append(Removal(str(path), "handoff", f"written {age / 86400:.1f} days ago"))
    for run_dir in layout.run_dirs(root):
        if not in_use(run_dir):
            removals.extend(checkpoint_leftovers(layout.checkpoint_dir(run_dir), older_than, now))
    return removals


def apply(removals: list[Removal]) -> tuple[list[Removal], list[tuple[Removal, str]]]:
    """Remove the planned files, each on its own; return the ones removed and the ones that failed (why)."""
    done, failed = [], []
    for removal in removals:
        path = Path(removal.path)
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            failed.append((removal, e.strerror or str(e)))
        else:
            done.append(removal)
    return done, failed
