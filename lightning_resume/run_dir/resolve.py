"""Decide which run directory a process uses, from a runs root (:mod:`.layout`) and a session."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

from lightning_resume._scheduler.environment import KeySource, Session
from lightning_resume._storage.atomic import create_text_exclusive, write_json_atomic
from lightning_resume._version import __version__
from lightning_resume._warnings import warn
from lightning_resume.exceptions import RunDirError
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.owner import RunLock, in_use_error, live_holder, process_start_ticks

log = logging.getLogger(__name__)

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class Resolution:
    path: Path
    run_id: str  # the directory's name
    is_resumed: bool  # this process continues an earlier attempt of the same run
    reason: str  # one line: why this directory
    owns_index: bool = False  # the session's index entry points here (not so for a rerun beside it)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "path": str(self.path)})

    @classmethod
    def from_json(cls, text: str) -> Resolution:
        data = json.loads(text)
        values = (Path(data["path"]), str(data["run_id"]), bool(data["is_resumed"]), str(data["reason"]))
        return cls(*values, bool(data["owns_index"]))


MAX_KEY_FILENAME = 200  # the longest file name a session key may become (filesystems allow 255 bytes)


def key_filename(key: str) -> str:
    """A file name for a session key: unsafe characters, and a leading ``.``, escaped as ``%XX``."""
    name = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in key) or "%00"
    return "%2E" + name[1:] if name.startswith(".") else name


def check_key(key: str, source: str) -> str:
    """Return ``key`` if it can be a session key, else raise ``ValueError`` naming its ``source``."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(
            f"{source} must be a non-empty string, got {key!r}. Leave it unset (None) to use the scheduler's "
            "job id, or give each job a name that identifies it across restarts."
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(f"{source} {key!r} contains control characters; use printable characters only.")
    length = len(key_filename(key).encode())
    if length > MAX_KEY_FILENAME:
        raise ValueError(
            f"{source} {key[:40] + '...'!r} is too long: {length} bytes as a file name, at most "
            f"{MAX_KEY_FILENAME}. Use a shorter key (a hash of a long one works)."
        )
    return key


def index_path(root: Path, key: str) -> Path:
    return root / layout.INDEX_DIR / key_filename(key)


def entry_target(root: Path, text: str) -> Path:
    """The run dir an index entry names: relative to the root, or absolute (a dir outside it)."""
    path = Path(text)
    return path if path.is_absolute() else root / path


#: What deleting an index entry does, for the messages that suggest it.
_DELETE = (
    "delete the entry to start a fresh run (a run dir stamped with this key, if there is exactly one, is "
    "resumed instead)"
)

_ENTRY_HINTS = {
    errno.ENOTDIR: "{index} is not a folder: move that file away",
    errno.EISDIR: "the entry is a folder, not a file: remove it",
}


def read_index(root: Path, key: str) -> Path | None:
    """The run dir recorded for ``key``, or ``None`` (:class:`RunDirError`: unreadable, or empty)."""
    entry = index_path(root, key)
    try:
        text = entry.read_bytes().decode().strip()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise RunDirError(
            f"The session index entry {str(entry)!r} is not UTF-8 text ({e}): it should hold one line, the "
            f"path of the run dir (relative to the root). Write that path into it, or {_DELETE}.",
            entry,
        ) from e
    except OSError as e:
        hint = _ENTRY_HINTS.get(e.errno or 0, "check its permissions").format(index=repr(str(entry.parent)))
        raise RunDirError(
            f"Cannot read the session index entry {str(entry)!r} ({e.strerror or e}): {hint}.", entry
        ) from e
    if not text:
        raise RunDirError(
            f"The session index entry {str(entry)!r} is empty. Write the run directory it belongs to into "
            f"it (relative to the root), or {_DELETE}.",
            entry,
        )
    return entry_target(root, text)


def write_index(root: Path, key: str, run_dir: Path) -> bool:
    """Record ``key -> run_dir`` unless an entry exists; an existing entry is never overwritten."""
    entry = index_path(root, key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    # Relative to the root (a moved root keeps working); a dir outside it by its absolute path.
    text = run_dir.relative_to(root).as_posix() if run_dir.is_relative_to(root) else str(run_dir)
    return create_text_exclusive(entry, f"{text}\n")


def read_meta(run_dir: Path) -> dict[str, Any]:
    """The ``run_meta.json`` of a run dir (an empty dict if it is missing or unreadable)."""
    meta = _read_meta_strict(run_dir)
    return meta if isinstance(meta, dict) else {}


def _read_meta_strict(run_dir: Path) -> dict[str, Any] | str:
    """The ``run_meta.json`` of a run dir, or why it cannot be read."""
    try:
        data = json.loads((run_dir / layout.RUN_META).read_bytes())
    except OSError as e:
        return str(e.strerror or e)
    except ValueError as e:
        return f"not JSON ({e})"
    if not isinstance(data, dict) or "session_key" not in data:
        return "not a run_meta object (no session_key)"
    return data


def own_run_dirs(root: Path, key: str) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The run dirs under ``root`` stamped with ``key``, and ``(dir, why)`` for the unreadable ones."""
    stamped, unreadable = [], []
    for run_dir in layout.run_dirs(root):
        meta = _read_meta_strict(run_dir)
        if isinstance(meta, dict):
            if meta["session_key"] == key:
                stamped.append(run_dir)
        elif (run_dir / layout.RUN_META).exists():  # not a racing launch's dir that is going away
            unreadable.append((run_dir, meta))
    return stamped, unreadable


_ROOT_HINTS = {
    errno.ENOSPC: "free space on that filesystem",
    errno.EDQUOT: "free space within your quota",
    errno.EACCES: "make the root writable by the user running training, or choose another root",
    errno.EPERM: "make the root writable by the user running training, or choose another root",
    errno.EROFS: "choose a root on a writable filesystem",
}


def _root_error(root: Path, action: str, error: OSError) -> RunDirError:
    hint = _ROOT_HINTS.get(error.errno or 0, "check the root and the filesystem it is on")
    return RunDirError(
        f"Cannot {action} under the runs root {str(root)!r}: {error.strerror or error}. Nothing was left "
        f"behind; {hint}.",
        root,
    )


def prepare_root(root: Path) -> None:
    """Create ``root`` if needed (:class:`RunDirError` when it is a file or cannot be created)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise RunDirError(
            f"The runs root {str(root)!r} is a file (or lies below one), not a directory. Pass RunDir a "
            "directory (it is created if missing).",
            root,
        ) from None
    except OSError as e:
        raise _root_error(root, "create the folder", e) from e


def create_run(root: Path, session: Session, now: datetime | None = None) -> tuple[Path, str, RunLock]:
    """A new run dir, locked before ``run_meta.json`` makes it one: ``(path, run_id, lock)``."""
    now = now or datetime.now()
    run_id = uuid.uuid4().hex[:12]
    path = layout.new_run_dir(root, now, run_id)
    created: list[Path] = []
    lock = RunLock(path)
    try:
        created = _make_run_dir(root, path)
        lock.acquire()
        _write_meta(path, run_id, session, now)
    except (OSError, RunDirError) as e:
        _remove(path, lock, created)
        if isinstance(e, RunDirError):
            raise
        raise _root_error(root, "create a run dir", e) from e
    return path, run_id, lock


def _make_run_dir(root: Path, path: Path) -> list[Path]:
    """Create ``path`` and its missing parents below ``root``; return those created, deepest first."""
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        missing = [p for p in (path, *path.parents) if root in p.parents and not p.is_dir()]
        try:
            for folder in reversed(missing):
                folder.mkdir(exist_ok=folder != path)
        except FileNotFoundError:  # a racing launch removed the empty parent it had made: again
            continue
        return missing
    raise FileNotFoundError(errno.ENOENT, "parent folders keep disappearing", str(path))


def _remove(path: Path, lock: RunLock, created: list[Path]) -> None:
    """Remove a run dir this launch created and nobody else knows of (a lost race, a failed write)."""
    (path / layout.RUN_META).unlink(missing_ok=True)  # first: no longer a run dir for a scan
    with contextlib.suppress(OSError):
        (path / layout.LOCK).unlink(missing_ok=True)
    lock.release()
    for folder in created or [path]:  # deepest first, and only when empty
        with contextlib.suppress(OSError):
            folder.rmdir()


def _write_meta(path: Path, run_id: str, session: Session, now: datetime) -> None:
    meta = {
        "run_id": run_id,
        "session_key": session.key,
        "key_source": session.source.value,
        "scheduler_ids": session.ids,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "created": now.isoformat(timespec="seconds"),
        "lightning_resume_version": __version__,
    }
    write_json_atomic(path / layout.RUN_META, meta)


class Claim(NamedTuple):
    """The run dir of a launch, and its lock (released when the attempt stops using the run dir)."""

    resolution: Resolution
    lock: RunLock


#: How often a launch looks again after losing a race for the index entry (to a launch that recorded it).
_TRIES = 5


def claim(root: Path, session: Session, now: datetime | None = None) -> Claim:
    """Choose and lock the run dir for the global-zero process of a launch (docs/src/run_dir.md)."""
    key = session.key
    if key is None:
        path, run_id, lock = create_run(root, session, now)
        return Claim(Resolution(path, run_id, False, "fresh run"), lock)
    continues = session.source is KeySource.EXPLICIT or session.scheduler_restart
    for _ in range(_TRIES):
        indexed = read_index(root, key)
        if indexed is not None:
            if continues:
                return _continue(root, key, indexed)
            return _beside(create_run(root, session, now), key, indexed)
        if continues:
            found = _adopt(root, key)
            if found == "again":
                continue
            if isinstance(found, Claim):
                return found
            if session.scheduler_restart:
                warn(
                    f"Session {key!r} reports a restart but nothing was recorded for it under {str(root)!r}: "
                    "the earlier attempt was stopped before it wrote anything, so this starts a fresh run.",
                    all_ranks=True,
                )
        fresh = _fresh(root, session, now, continues)
        if fresh is not None:
            return fresh
    raise RunDirError(  # five lost races in a row: launches keep arriving
        f"Session {key!r} kept changing under {str(root)!r} while this launch looked for its run dir: other "
        "launches of this key are starting right now. Launch it once.",
        index_path(root, key),
    )


def resolve(root: Path, session: Session, now: datetime | None = None) -> Resolution:
    """:func:`claim` for a caller that only needs the decision: the lock is released at once."""
    found = claim(root, session, now)
    found.lock.release()
    return found.resolution


def _continue(root: Path, key: str, indexed: Path) -> Claim:
    """The run dir the index names for ``key``, locked for this attempt."""
    if not indexed.is_dir():
        raise RunDirError(
            f"The session index {str(index_path(root, key))!r} points at {str(indexed)!r}, which does not "
            f"exist (deleted, or moved to another place under the root?). Restore that directory, or write "
            f"the run dir's path into the entry, or {_DELETE}.",
            index_path(root, key),
        )
    check_run_dir(root, key, indexed)
    lock = RunLock(indexed)
    lock.acquire()
    reason = f"restart of session {key!r}: reusing the indexed run dir"
    return Claim(Resolution(indexed, indexed.name, True, reason, True), lock)


def _adopt(root: Path, key: str) -> Claim | Literal["again"] | None:
    """Without an index entry: the one run dir stamped with ``key``, locked and recorded again."""
    stamped, unreadable = own_run_dirs(root, key)
    if not stamped and not unreadable:
        return None
    entry = index_path(root, key)
    if len(stamped) > 1 or unreadable:
        if entry.exists():
            return "again"  # a racing launch recorded the key meanwhile
        for run_dir in stamped:  # a racing launch that has not recorded the key yet: it is the one
            holder = live_holder(run_dir)
            if holder is not None:
                raise in_use_error(run_dir, holder)
        if unreadable:
            listed = ", ".join(f"{str(p)!r} ({why})" for p, why in unreadable)
            raise RunDirError(
                f"Session {key!r} has no index entry {str(entry)!r}, and the run_meta.json of {listed} "
                "cannot be read: that run dir may be this session's own run. Restore its run_meta.json, or "
                f"move it out of the root {str(root)!r}, then relaunch.",
                entry,
            )
        listed = ", ".join(repr(str(p)) for p in stamped)
        raise RunDirError(
            f"Session {key!r} has no index entry {str(entry)!r}, and {len(stamped)} run dirs are stamped "
            f"with this key: {listed}. Write the path of the one to resume into the entry (one line, "
            "relative to the root), or move the others out of the root, then relaunch.",
            entry,
        )
    (run_dir,) = stamped
    check_run_dir(root, key, run_dir, found_by_key=True)
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        recorded = write_index(root, key, run_dir)
    except OSError as e:
        lock.release()
        raise _root_error(root, f"record session {key!r} in the index", e) from e
    if not recorded:  # a racing launch recorded the key meanwhile
        lock.release()
        return "again"
    log.warning(
        "Session %r had no index entry: resuming the one run dir stamped with this key, %s, and recording "
        "it again in %s.",
        key,
        run_dir,
        entry,
    )
    reason = f"restart of session {key!r}: its run dir was found by its key, the index entry recreated"
    return Claim(Resolution(run_dir, run_dir.name, True, reason, True), lock)


def _fresh(root: Path, session: Session, now: datetime | None, continues: bool) -> Claim | None:
    """A fresh run dir recorded for the key; ``None`` when a racing launch recorded its own first."""
    key = str(session.key)
    path, run_id, lock = create_run(root, session, now)
    try:
        recorded = write_index(root, key, path)
    except OSError as e:
        _remove(path, lock, [])  # unrecorded, it would be an orphan
        raise _root_error(root, f"record session {key!r} in the index", e) from e
    if recorded:
        return Claim(Resolution(path, run_id, False, f"fresh run, recorded for session {key!r}", True), lock)
    if continues:
        _remove(path, lock, [path, path.parent, path.parent.parent])
        return None
    return _beside((path, run_id, lock), key, read_index(root, key))


def _beside(created: tuple[Path, str, RunLock], key: str, owner: Path | None) -> Claim:
    """A fresh run dir (a rerun under a key without a restart); the index keeps naming ``owner``."""
    path, run_id, lock = created
    reason = f"fresh run; session {key!r} already belongs to {str(owner)!r} (kept)"
    return Claim(Resolution(path, run_id, False, reason), lock)


def check_run_dir(root: Path, key: str, run_dir: Path, found_by_key: bool = False) -> None:
    """Raise :class:`RunDirError` unless ``run_dir`` is a run dir of ``key`` (``found_by_key``: its stamp)."""
    entry = index_path(root, key)
    where = (
        f"The run dir {str(run_dir)!r} stamped with session {key!r}"
        if found_by_key
        else f"The session index entry {str(entry)!r} points at {str(run_dir)!r}"
    )
    if not layout.is_run_place(root, run_dir):
        raise RunDirError(
            f"{where}, which is not a run dir under the root {str(root)!r}: training would write into "
            f"it. Write the path of this session's run dir into the entry, or {_DELETE}.",
            entry,
        )
    meta = _read_meta_strict(run_dir)
    if not isinstance(meta, dict):
        raise RunDirError(
            f"{where}, whose {layout.RUN_META} cannot be read ({meta}): it is not a run dir, or it was "
            f"damaged. Restore run_meta.json, or {_DELETE}.",
            entry,
        )
    if meta["session_key"] != key:
        raise RunDirError(
            f"{where}, a run dir of session {meta['session_key']!r}, not {key!r}: resuming it would mix two "
            f"jobs. Write the path of this session's run dir into the entry, or {_DELETE}.",
            entry,
        )
    recorded_id = meta.get("run_id", run_dir.name)
    if recorded_id != run_dir.name:
        raise RunDirError(
            f"{where}, whose {layout.RUN_META} belongs to run {recorded_id!r}, not to {run_dir.name!r} (the "
            "dir's name is its run id): it was copied from another run dir, or the dir was renamed. Rename "
            "the dir back, or restore its own run_meta.json.",
            entry,
        )


def check_index(root: Path, key: str, run_dir: Path) -> None:
    """Raise with diagnostics unless the index entry for ``key`` points at ``run_dir``."""
    entry = index_path(root, key)
    try:
        recorded = read_index(root, key)
    except RunDirError as e:
        recorded, problem = None, str(e)
    else:
        problem = "missing" if recorded is None else f"points at {str(recorded)!r}"
    if recorded is not None and recorded.resolve() == run_dir.resolve():
        return
    entries = sorted(p.name for p in entry.parent.iterdir()) if entry.parent.is_dir() else []
    raise RunDirError(
        f"Session index guard: {str(entry)!r} should point at this run {str(run_dir)!r} but is {problem}. "
        f"A restart of session {key!r} would not find this run. Index entries: {entries[:20]}. Another "
        "job with the same key (or a manual edit) claimed the entry; give each job its own key "
        "(RunDir(key=...) or $LIGHTNING_RESUME_KEY), or fix the entry to point at the run to resume.",
        entry,
    )


def process_start_time() -> float:
    """Wall-clock start time of this process (Linux ``/proc``; now, elsewhere)."""
    ticks = process_start_ticks("self")  # not getpid(): /proc may be another PID namespace's
    try:
        # Boot time from the uptime (10 ms), not /proc/stat's btime (whole s): compared with time.time().
        boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() if ticks is None else boot + ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class IndexEntry:
    """One file of the session index (named by the escaped key), its run dir, or why it cannot be read."""

    path: Path
    target: Path | None
    error: str = ""


def index_entries(root: Path) -> list[IndexEntry]:
    """Every session index entry under ``root``, sorted by file name (hidden files left out)."""
    folder = root / layout.INDEX_DIR
    found = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name.startswith("."):
            continue
        try:
            text = path.read_text().strip()
        except OSError as e:
            found.append(IndexEntry(path, None, str(e)))
            continue
        found.append(IndexEntry(path, entry_target(root, text) if text else None, "" if text else "empty"))
    return found
