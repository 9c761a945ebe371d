"""Checkpoint files on a local filesystem: commit, remove, list and clean up.

A commit writes a temporary file in the target directory (checksummed as it is written, and past the
page cache where the filesystem allows: see ``direct_file``), fsyncs it, replaces the manifest (new
entry first, the replaced file's entry kept), renames the data file into place and fsyncs the
directory. A kill at any instant leaves the old or the new data file, each
matching an entry of the manifest on disk. Temporary names carry the writing process id, so a later
process removes only the leftovers of processes that are gone.

Pure standard library: the writer process imports this module without torch or lightning.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lightning_resume._writer.atomic import TEMP_PREFIX, atomic_open, fsync_dir, replace_durably, temp_sibling
from lightning_resume._writer.direct_file import DirectFile, new_buffer
from lightning_resume._writer.duty_cycle import DutyCycle
from lightning_resume._writer.manifest import (
    ChecksumWriter,
    Entry,
    data_name,
    encode,
    is_manifest,
    manifest_path,
    next_entries,
    read_entries,
    sized,
)

_TEMP_NAME = re.compile(rf"^{re.escape(TEMP_PREFIX)}(\d+)-")

_HINTS = {
    errno.ENOSPC: "free space on that filesystem, or keep fewer checkpoints (keep=..., save_top_k=...)",
    errno.EDQUOT: "free space within your quota, or keep fewer checkpoints (keep=..., save_top_k=...)",
    errno.EFBIG: "the file exceeds a file-size limit of this process or filesystem (ulimit -f)",
    errno.EACCES: "make the checkpoint directory writable by the user running training",
    errno.EPERM: "make the checkpoint directory writable by the user running training",
    errno.EROFS: "save checkpoints to a writable filesystem",
}


def save_error(err: int | None, strerror: str, filename: str | None, path: str | Path) -> OSError:
    """An ``OSError`` (of the subclass ``err`` maps to) that says which save failed and what to do."""
    hint = _HINTS.get(err or 0, "check the checkpoint directory and the filesystem it is on")
    message = f"Could not save checkpoint {str(path)!r}: {strerror}. The previous checkpoint is intact; "
    message += hint
    return OSError(err, message, filename) if err is not None else OSError(message)


def write_manifest(path: str | Path, entries: Iterable[Entry]) -> None:
    """Replace the manifest of ``path`` atomically and durably."""
    with atomic_open(manifest_path(path), "w") as handle:
        handle.write(encode(list(entries)))


def current_entries(path: str | Path, known: Entry | None = None) -> list[Entry]:
    """The entries that may describe the data file now at ``path`` (a new manifest must keep them)."""
    if known is not None:
        return [known]
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return []
    return sized(read_entries(path) or [], size)


def commit(
    path: str | Path,
    write: Callable[[ChecksumWriter], None],
    make_entry: Callable[[int, str], Entry],
    known: Entry | None = None,
    direct: bool = True,
    buffer: mmap.mmap | None = None,
    pace: DutyCycle | None = None,
) -> Entry:
    """Write a new version of ``path`` through ``write`` and commit it; return its manifest entry.

    Args:
        path: The checkpoint file.
        write: Writes the content to the checksumming file object it is given.
        make_entry: Builds the entry from the written ``(size, checksum)``.
        known: The entry of the data file now at ``path``, when the caller committed it itself.
        direct: Write past the page cache where the filesystem allows it.
        buffer: A buffer from ``direct_file.new_buffer()`` to reuse (default: a new one).
        pace: Paces the write (a background write's duty cycle) and records its fsync time.

    Raises:
        OSError: from the filesystem; ``path`` and its manifest are then as they were.
    """
    path = Path(path)
    fd, tmp = temp_sibling(path)
    try:
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
        entry = make_entry(out.checksum.size, out.checksum.hexdigest())
        # The manifest goes first: whichever data file a kill leaves at ``path`` matches an entry.
        write_manifest(path, next_entries(entry, current_entries(path, known)))
        replace_durably(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return entry


def remove(path: str | Path) -> None:
    """Delete a checkpoint file, then its manifest (a kill in between leaves a manifest without data)."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(manifest_path(path))
    fsync_dir(path.parent)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this one, or another this user may or may not signal)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(directory: str | Path) -> list[str]:
    """Delete temporary files of dead processes and manifests whose data file is gone; return the names.

    Manifests are left alone while a live process has temporary files here (it may be mid-commit).
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    busy = False
    for name in names:
        found = _TEMP_NAME.match(name)
        if found is None:
            continue
        if process_alive(int(found.group(1))):
            busy = True
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(Path(directory, name))
            removed.append(name)
    if not busy:
        present = set(names)
        for name in names:
            if is_manifest(name) and not name.startswith(TEMP_PREFIX) and data_name(name) not in present:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(Path(directory, name))
                    removed.append(name)
    if removed:
        fsync_dir(directory)
    return removed
