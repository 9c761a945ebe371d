"""How fast a directory takes durable writes: a temporary file written as checkpoints are, fsynced and
removed (named with this pid, so that a kill's leftover is cleaned up by the next save there)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from lightning_resume._storage.atomic import fsync_dir, temp_sibling
from lightning_resume._storage.direct_file import BLOCK, DirectFile, new_buffer

DEFAULT_BYTES = 64 << 20  #: long enough for a steady speed, short enough for a command line check


def measure_write_speed(directory: str | Path, nbytes: int = DEFAULT_BYTES, direct: bool = True) -> float:
    """Write ``nbytes`` of random data into ``directory`` (past the page cache where ``direct`` and
    allowed), fsync, remove it; return bytes per second (``ValueError`` for ``nbytes`` <= 0, ``OSError``)."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes!r}.")
    block = os.urandom(min(nbytes, BLOCK))  # incompressible, so compressing filesystems show their disk
    fd, tmp = temp_sibling(Path(directory) / "write-speed")
    try:
        started = time.monotonic()
        try:
            with DirectFile(fd, new_buffer(), direct) as out:
                for offset in range(0, nbytes, len(block)):
                    out.write(block[: nbytes - offset])
                out.finish()
            os.fsync(fd)
            elapsed = time.monotonic() - started
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fsync_dir(directory)
    return nbytes / max(elapsed, 1e-9)
