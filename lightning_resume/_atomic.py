"""Atomic file writes: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import contextlib
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
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(
    path: str | Path, mode: str = "wb", prefix: str = TEMP_PREFIX, suffix: str = ""
) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path``; on a clean exit it is fsynced and renamed onto ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was. ``prefix`` and
    ``suffix`` name the temporary file (so that stale ones can be recognised and cleaned up).

    Example::

        with atomic_open("run_meta.json", "w") as f:
            f.write("{}")
    """
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    fsync_dir(target.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(text)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def create_text_exclusive(path: str | Path, text: str) -> bool:
    """Atomically create ``path`` with ``text`` unless it exists; return whether this call created it.

    The content is written to a temporary file first and then hard-linked into place, so the entry
    either does not exist or is complete, and two writers racing for it cannot both win.
    """
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp_name, target)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network or FUSE filesystems)
            if target.exists():
                return False
            os.replace(tmp_name, target)
        fsync_dir(target.parent)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
