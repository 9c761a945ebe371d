"""How fast a directory takes durable writes: the speed a checkpoint reaches disk there.

A temporary file is written as checkpoints are (``direct_file``), fsynced and removed; its name carries
this process id, so the next save there removes what a kill in between leaves. Pure standard library.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from lightning_resume._storage.atomic import fsync_dir, temp_sibling
from lightning_resume._storage.direct_file import BLOCK, DirectFile, new_buffer

#: Bytes written by default: long enough for a steady speed, short enough for a command line check.
DEFAULT_BYTES = 64 << 20


def measure_write_speed(directory: str | Path, nbytes: int = DEFAULT_BYTES, direct: bool = True) -> float:
    """Write ``nbytes`` of random data into ``directory``, fsync, remove it; return bytes per second.

    Args:
        directory: An existing directory (the checkpoint directory, or the run root).
        nbytes: Bytes to write (> 0).
        direct: Write past the page cache where the filesystem allows it, as checkpoints are.

    Raises:
        ValueError: ``nbytes`` is not positive.
        OSError: the directory cannot be written to.

    Example::

        seconds_to_durable = checkpoint_size / measure_write_speed("runs")
    """
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
