"""Commit, remove and prune the checkpoints of a local folder (both kinds). A commit writes the new
version aside, fsyncs it, puts its manifest in place and swaps it in with one rename: a kill at any
instant leaves the old version or the new one, each matching its manifest."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from lightning_resume._storage.atomic import write_text_atomic
from lightning_resume._storage.catalog import retention
from lightning_resume._storage.direct_file import DirectFile, Pace, new_buffer
from lightning_resume._storage.kinds import FILE, Kind, Step, unobserved
from lightning_resume._storage.manifest import ChecksumWriter, Entry, R, next_entries
from lightning_resume._storage.store import LocalStore, Store

#: The steps of a commit, in order, as passed to its ``on_step`` observer (``mid_delete``: pruning).
COMMIT_STEPS = ("before_manifest", "before_rename", "before_swap", "after_swap", "mid_delete")

_HINTS = {
    errno.ENOSPC: "free space on that filesystem, or keep fewer checkpoints (keep=..., save_top_k=...)",
    errno.EDQUOT: "free space within your quota, or keep fewer checkpoints (keep=..., save_top_k=...)",
    errno.EFBIG: "the file exceeds a file-size limit of this process or filesystem (ulimit -f)",
    errno.EACCES: "make the checkpoint directory writable by the user running training",
    errno.EPERM: "make the checkpoint directory writable by the user running training",
    errno.EROFS: "save checkpoints to a writable filesystem",
}


class TimedPace(Pace, Protocol):
    """A ``direct_file.Pace`` that also records how long the fsync took."""

    fsync_seconds: float


def save_error(err: int | None, strerror: str, filename: str | None, path: str | Path) -> OSError:
    """An ``OSError`` (of the subclass ``err`` maps to) that says which save failed and what to do."""
    hint = _HINTS.get(err or 0, "check the checkpoint directory and the filesystem it is on")
    message = f"Could not save checkpoint {str(path)!r}: {strerror}. The previous checkpoint is intact; "
    return OSError(err, message + hint, filename) if err is not None else OSError(message + hint)


def commit(
    kind: Kind[R],
    staged: Path,
    target: Path,
    records: Sequence[R],
    name: str | None = None,
    on_step: Step = unobserved,
) -> Path:
    """Make ``staged`` (fsynced) what ``target`` names, with the manifest ``records``, as ``name`` (default:
    from its step); return where it is now. On an ``OSError``, ``target`` is as it was."""
    try:
        on_step("before_manifest")
        write_text_atomic(kind.manifest_at(staged, target), kind.encode(records))
        on_step("before_rename")
        final = kind.swap(staged, target, records[0], name, on_step)
    except BaseException:
        LocalStore(staged.parent).remove(staged.name, tree=kind.directory)
        raise
    on_step("after_swap")
    return final


def write_new(
    path: Path,
    write: Callable[[ChecksumWriter], None],
    direct: bool = True,
    buffer: mmap.mmap | None = None,
    pace: TimedPace | None = None,
) -> tuple[int, str]:
    """Write and fsync ``path`` through ``write`` (given a checksumming file); return its size, checksum."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    staging = buffer if buffer is not None else new_buffer()
    try:
        with DirectFile(fd, staging, direct, pace) as file:
            out = ChecksumWriter(file)
            write(out)
            file.finish()
        started = time.monotonic()
        os.fsync(fd)
        if pace is not None:
            pace.fsync_seconds = time.monotonic() - started
    finally:
        os.close(fd)
        if staging is not buffer:
            # After a failed write the traceback may still hold views of it: then the GC frees it.
            with contextlib.suppress(BufferError):
                staging.close()
    return out.checksum.size, out.checksum.hexdigest()


def write_file(
    path: str | Path,
    write: Callable[[ChecksumWriter], None],
    make_entry: Callable[[int, str], Entry],
    known: Entry | None = None,
    direct: bool = True,
    buffer: mmap.mmap | None = None,
    pace: TimedPace | None = None,
) -> Entry:
    """Write (:func:`write_new`) and commit a new version of ``path``, its entry ``make_entry(size,
    checksum)``; ``known``: the entry of the file now at ``path``, when the caller committed it."""
    path = Path(path)
    staged = FILE.stage(path)
    try:
        entry = make_entry(*write_new(staged, write, direct, buffer, pace))
    except BaseException:
        LocalStore(staged.parent).remove(staged.name)
        raise
    current = [known] if known is not None else FILE.held(LocalStore(path.parent), path.name)
    commit(FILE, staged, path, next_entries(entry, current))
    return entry


def remove(store: Store, kind: Kind[R], name: str, on_step: Step = unobserved) -> None:
    """Delete checkpoint ``name``: first what would let a half-deleted one count."""
    for index, (part, folder) in enumerate(kind.removal(name)):
        if index:
            on_step("mid_delete")
        store.remove(part, tree=folder)


def prune(
    store: Store, kind: Kind[R], keep: int | None, current: str | None = None, on_step: Step = unobserved
) -> list[str]:
    """Remove what ``catalog.retention`` names (never ``current``); return the names."""
    doomed = retention(store, kind, keep, current)
    for name in doomed:
        remove(store, kind, name, on_step)
    return doomed
