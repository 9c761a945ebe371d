"""Atomic file writes (a reader sees the old file or the new one): a temporary sibling named with the
writer's pid (so leftovers of dead processes are recognised), fsynced, renamed, the folder fsynced."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TEMP_PREFIX = ".lr-tmp-"


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry to disk so a completed rename survives a power cut."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """Flush a file's data to disk (for files written by someone else, e.g. Lightning or DCP)."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def write_bytes_durably(path: str | Path, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file ``path`` and fsync it (inside a directory written aside: no rename)."""
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def process_umask() -> int:
    """This process's umask, read without changing it (Linux ``/proc``; a set-and-reset elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # the only portable read; not thread-safe, so only where /proc is missing
    os.umask(mask)
    return mask


def temp_sibling(path: str | Path, prefix: str = TEMP_PREFIX) -> tuple[int, Path]:
    """Create ``<prefix><pid>-<random>-<name>.tmp`` beside ``path``, mode as ``open()`` would give."""
    target = Path(path)
    fd, name = tempfile.mkstemp(
        prefix=f"{prefix}{os.getpid()}-", suffix=f"-{target.name}.tmp", dir=target.parent
    )
    with contextlib.suppress(OSError):  # a filesystem without modes (some FUSE mounts) keeps its own
        os.fchmod(fd, 0o666 & ~process_umask())
    return fd, Path(name)


def replace_durably(temporary: str | Path, path: str | Path) -> None:
    """Rename an fsynced ``temporary`` file onto ``path`` and fsync the directory."""
    os.replace(temporary, path)
    fsync_dir(Path(path).parent)


@contextlib.contextmanager
def atomic_open(
    path: str | Path, mode: str = "wb", prefix: str = TEMP_PREFIX, durable: bool = True
) -> Iterator[IO[Any]]:
    """A temporary sibling of ``path``: renamed onto it (fsynced if ``durable``) if the block ends cleanly."""
    fd, temporary = temp_sibling(path, prefix)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if durable:
            replace_durably(temporary, path)
        else:
            os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an advisory lock on ``path`` (created if missing) for the block: processes take turns."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~process_umask())
    try:
        with contextlib.suppress(OSError):  # no locks here: each process does the work itself
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def write_text_replacing(path: str | Path, text: str) -> None:
    """:func:`write_text_atomic` without fsync: whole or absent after a kill (the page cache outlives the
    process), not after a power loss; for small records written where an fsync would cost a step."""
    with atomic_open(path, "w", durable=False) as handle:
        handle.write(text)


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def create_text_exclusive(path: str | Path, text: str) -> bool:
    """Atomically create ``path`` with ``text`` unless it exists; return whether this call created it.
    Hard-linked into place: a rename would replace what another writer created meanwhile."""
    target = Path(path)
    fd, temporary = temp_sibling(target)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network or FUSE filesystems)
            if target.exists():
                return False
            os.replace(temporary, target)
        fsync_dir(target.parent)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
