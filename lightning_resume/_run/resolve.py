"""Decide which run directory a process uses: pure functions over a root folder and a session.

The layout of the root is in :mod:`lightning_resume._run.layout`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from lightning_resume._run import layout
from lightning_resume._run.scheduler import KeySource, Session
from lightning_resume._storage.atomic import create_text_exclusive, write_json_atomic
from lightning_resume._version import __version__
from lightning_resume._warnings import warn
from lightning_resume.exceptions import RunDirError

_MISSING = object()

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class Resolution:
    """The outcome of run-dir resolution.

    Attributes:
        path: The run directory.
        run_id: The run's unique id (the directory's name).
        is_resumed: Whether this process continues an earlier attempt of the same run.
        reason: One line saying why this directory was chosen.
        owns_index: Whether the session index entry points at this run (an interactive rerun under
            an already-recorded key does not own it).
    """

    path: Path
    run_id: str
    is_resumed: bool
    reason: str
    owns_index: bool = False

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "path": str(self.path)})

    @classmethod
    def from_json(cls, text: str) -> Resolution:
        data = json.loads(text)
        return cls(
            Path(data["path"]),
            str(data["run_id"]),
            bool(data["is_resumed"]),
            str(data["reason"]),
            bool(data["owns_index"]),
        )


#: The longest file name a session key may become (filesystems allow 255 bytes; leave room).
MAX_KEY_FILENAME = 200


def key_filename(key: str) -> str:
    """A file name for a session key: safe characters kept, anything else escaped as ``%XX``.

    A leading ``.`` is escaped too, so that no key names ``.``, ``..`` or a hidden file.
    """
    name = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in key) or "%00"
    return "%2E" + name[1:] if name.startswith(".") else name


def check_key(key: str, source: str) -> str:
    """Return ``key`` if it can be a session key.

    Args:
        key: The key.
        source: Where it came from, for the message (``"RunDir(key=...)"``, ``"$LIGHTNING_RESUME_KEY"``).

    Raises:
        ValueError: an empty key (use ``None`` for no key), one with control characters, or one too
            long to be a file name.
    """
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


def read_index(root: Path, key: str) -> Path | None:
    """The run dir recorded for ``key``, or ``None`` when there is no entry."""
    entry = index_path(root, key)
    try:
        text = entry.read_bytes().decode().strip()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise RunDirError(
            f"The session index entry {str(entry)!r} is not UTF-8 text ({e}): it should hold one line, the "
            "path of the run dir. Write that path into it, or delete it to start a fresh run.",
            entry,
        ) from e
    except OSError as e:
        raise RunDirError(
            f"Cannot read the session index entry {str(entry)!r}: {e}. Check its permissions.", entry
        ) from e
    if not text:
        raise RunDirError(
            f"The session index entry {str(entry)!r} is empty. Write the run directory it belongs to into "
            "it, or delete it to start a fresh run.",
            entry,
        )
    return Path(text)


def write_index(root: Path, key: str, run_dir: Path) -> bool:
    """Record ``key -> run_dir`` unless an entry exists; an existing entry is never overwritten."""
    entry = index_path(root, key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    return create_text_exclusive(entry, f"{run_dir}\n")


def read_meta(run_dir: Path) -> dict[str, Any]:
    """The ``run_meta.json`` of a run dir (an empty dict if it is missing or unreadable)."""
    try:
        data = json.loads((run_dir / layout.RUN_META).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def find_orphans(root: Path, key: str) -> list[Path]:
    """Run dirs under ``root`` whose ``run_meta.json`` is stamped with session ``key``."""
    return [run_dir for run_dir in layout.run_dirs(root) if read_meta(run_dir).get("session_key") == key]


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
    """Create ``root`` if needed.

    Raises:
        RunDirError: ``root`` (or a parent) is a file, or cannot be created.
    """
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


def create_run(root: Path, session: Session, now: datetime | None = None) -> tuple[Path, str]:
    """Create a new, unique run dir with its ``run_meta.json``; return ``(path, run_id)``.

    Raises:
        RunDirError: the filesystem refused (full, read-only, no permission); no empty or half-made
            run dir is left behind.
    """
    now = now or datetime.now()
    run_id = uuid.uuid4().hex[:12]
    path = layout.new_run_dir(root, now, run_id)
    missing = [p for p in (path, *path.parents) if not p.exists() and root in p.parents]
    try:
        path.mkdir(parents=True, exist_ok=False)
        _write_meta(path, run_id, session, now)
    except OSError as e:
        (path / layout.RUN_META).unlink(missing_ok=True)
        for folder in missing:  # deepest first: only folders this call created, and only when empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise _root_error(root, "create a run dir", e) from e
    return path, run_id


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


def resolve(root: Path, session: Session, now: datetime | None = None) -> Resolution:
    """Choose the run dir for the global-zero process of a launch.

    A restart (the scheduler says so, or an explicit key already has an index entry) reuses the
    indexed dir. Anything else creates a fresh dir and records it for the key if the key has no entry.

    Raises:
        RunDirError: a restart whose index entry is missing while a dir stamped with the key exists,
            or whose entry points at a directory that no longer exists.
    """
    key = session.key
    indexed = read_index(root, key) if key is not None else None
    restart = session.scheduler_restart or (session.source is KeySource.EXPLICIT and indexed is not None)
    if key is not None and restart:
        if indexed is not None:
            if not indexed.is_dir():
                raise RunDirError(
                    f"The session index {str(index_path(root, key))!r} points at {str(indexed)!r}, which "
                    "does not exist (moved or deleted?). Restore that directory, or delete the index "
                    "entry to start a fresh run.",
                    index_path(root, key),
                )
            check_run_dir(root, key, indexed)
            run_id = str(read_meta(indexed).get("run_id") or indexed.name)
            return Resolution(
                indexed, run_id, True, f"restart of session {key!r}: reusing the indexed run dir", True
            )
        orphans = find_orphans(root, key)
        if orphans:
            listed = ", ".join(repr(str(p)) for p in orphans)
            raise RunDirError(
                f"This is a restart of session {key!r}, but {str(index_path(root, key))!r} is missing while "
                f"run dir(s) stamped with this key exist: {listed}. An earlier attempt created its run dir "
                "and died before recording it. Write the right run dir into the index entry (one line: the "
                "path) to resume it, or delete the dir(s) to start fresh.",
                index_path(root, key),
            )
        warn(
            f"Session {key!r} reports a restart but nothing was recorded for it under {str(root)!r}: the "
            "earlier attempt was stopped before it wrote anything, so this starts a fresh run.",
            all_ranks=True,
        )
    path, run_id = create_run(root, session, now)
    if key is None:
        return Resolution(path, run_id, False, "fresh run")
    try:
        recorded = write_index(root, key, path)
    except OSError as e:
        shutil.rmtree(path, ignore_errors=True)  # unrecorded, it would be an orphan
        raise _root_error(root, f"record session {key!r} in the index", e) from e
    if recorded:
        return Resolution(path, run_id, False, f"fresh run, recorded for session {key!r}", True)
    owner = read_index(root, key)
    return Resolution(
        path, run_id, False, f"fresh run; session {key!r} already belongs to {str(owner)!r} (kept)"
    )


def check_run_dir(root: Path, key: str, run_dir: Path) -> None:
    """Refuse an index entry that names anything but a run dir of ``key`` under ``root/runs``.

    Raises:
        RunDirError: the target is outside ``root/runs/YYYYMMDD/HHMMSS/``, has no readable
            ``run_meta.json``, or was created for another session key.
    """
    entry = index_path(root, key)
    where = f"The session index entry {str(entry)!r} points at {str(run_dir)!r}"
    if not layout.is_under_runs(root, run_dir):
        raise RunDirError(
            f"{where}, which is not a run dir under {str(root / layout.RUNS)!r}: training would write into "
            "it. Write the path of this session's run dir into the entry, or delete the entry to start a "
            "fresh run.",
            entry,
        )
    recorded = read_meta(run_dir).get("session_key", _MISSING)
    if recorded is _MISSING:
        raise RunDirError(
            f"{where}, which has no readable {layout.RUN_META}: it is not a run dir (or it was damaged). "
            "Restore run_meta.json, or delete the entry to start a fresh run.",
            entry,
        )
    if recorded != key:
        raise RunDirError(
            f"{where}, a run dir of session {recorded!r}, not {key!r}: resuming it would mix two jobs. Write "
            "the path of this session's run dir into the entry, or delete the entry to start a fresh run.",
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


def handoff_path(root: Path, launch: str) -> Path:
    return root / layout.HANDOFF_DIR / key_filename(launch)


def publish_handoff(root: Path, launch: str, resolution: Resolution) -> None:
    """Publish rank 0's choice for the other ranks of the same launch (atomic)."""
    path = handoff_path(root, launch)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {**json.loads(resolution.to_json()), "written": time.time()})


def wait_for_handoff(
    root: Path, launch: str, timeout: float, not_before: float, poll: float = 0.05
) -> Resolution:
    """Wait for rank 0 of this launch to publish its run dir.

    Args:
        root: The runs root.
        launch: The launch key shared by all ranks.
        timeout: Seconds to wait.
        not_before: Ignore a handoff written before this time (a leftover of an earlier launch).
        poll: Seconds between looks.

    Raises:
        RunDirError: nothing usable appeared within ``timeout``.
    """
    path = handoff_path(root, launch)
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = json.loads(path.read_text())
            if float(data.get("written", 0)) >= not_before and Path(data["path"]).is_dir():
                return Resolution.from_json(json.dumps(data))
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() >= deadline:
            raise RunDirError(
                f"Rank 0 did not publish its run dir at {str(path)!r} within {timeout:.0f} s. Is rank 0 "
                "alive, and is the runs root on a filesystem every rank shares? Raise "
                "RunDir(handoff_timeout=...) for slow shared filesystems.",
                path,
            )
        time.sleep(poll)


def process_start_time() -> float:
    """Wall-clock start time of this process (Linux ``/proc``; now, elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


@dataclass(frozen=True)
class IndexEntry:
    """One file of the session index, as found on disk.

    Attributes:
        path: The index file (its name is the escaped session key).
        target: The run dir it records (``None`` when it cannot be read).
        error: Why it cannot be read (empty when it can).
    """

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
        found.append(IndexEntry(path, Path(text) if text else None, "" if text else "empty"))
    return found
