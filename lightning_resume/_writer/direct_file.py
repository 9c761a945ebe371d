"""Sequential file writes that bypass the page cache (``O_DIRECT``), with a buffered fallback.

A checkpoint written through the page cache costs the machine twice: every byte is copied into
freshly allocated cache pages (kernel time that competes with training for the CPU and memory
bandwidth), and those pages then push the training data out of the cache. Written directly, the
bytes go from one reused, aligned buffer to the device. Direct writes must start at aligned offsets
and have aligned lengths, so the last block is padded and the file truncated to its true size.

Filesystems that refuse direct writes (ramfs, tmpfs on older kernels, many FUSE filesystems) get
ordinary buffered writes of the same bytes. Pure standard library: the writer process imports it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os

log = logging.getLogger(__name__)

#: Offsets and lengths of direct writes are multiples of this (covers 512- and 4096-byte devices).
ALIGN = 4096
#: Size of the reused aligned buffer, i.e. of each direct write.
BLOCK = 8 << 20


def new_buffer() -> mmap.mmap:
    """An aligned buffer for :class:`DirectFile` (anonymous memory is page-aligned); reuse it."""
    return mmap.mmap(-1, BLOCK)


def set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; return whether it is on (False where unsupported)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | os.O_DIRECT) if on else (flags & ~os.O_DIRECT))
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return False
    return on


class DirectFile:
    """A write-only stream over an open file descriptor, written with ``O_DIRECT`` where possible.

    Bytes collect in an aligned buffer that is written out whenever it is full; :meth:`finish`
    writes the rest and sets the file's size. When the filesystem rejects direct I/O (at the switch
    or at a write), the same bytes go through the page cache instead.

    Args:
        fd: A file descriptor of an empty file open for writing (not closed here).
        buffer: From :func:`new_buffer`, used by one file at a time.
        direct: Try ``O_DIRECT`` (``False``: write through the page cache).
    """

    def __init__(self, fd: int, buffer: mmap.mmap, direct: bool = True) -> None:
        self.fd = fd
        self.size = 0
        self.direct = set_direct(fd, True) if direct else False
        self._buffer = buffer
        self._used = 0
        self._written = 0

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < view.nbytes:
            n = min(BLOCK - self._used, view.nbytes - done)
            self._buffer[self._used : self._used + n] = view[done : done + n]
            self._used += n
            done += n
            if self._used == BLOCK:
                self._drain()
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        """Nothing to do: the buffered tail is written by :meth:`finish`."""

    def close(self) -> None:
        """Leave the descriptor open: its owner finishes, fsyncs and closes it."""

    def finish(self) -> None:
        """Write what is still buffered and give the file its exact size (call before the fsync)."""
        if self._used:
            self._drain()
        os.ftruncate(self.fd, self.size)  # drops the padding of the last direct write

    def _drain(self) -> None:
        used = self._used
        with memoryview(self._buffer) as whole:
            if self.direct:
                padded = -(-used // ALIGN) * ALIGN
                whole[used:padded] = bytes(padded - used)
                try:
                    _pwrite_all(self.fd, whole[:padded], self._written)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    # The filesystem took the flag but not the write: go on through the page cache.
                    log.debug("direct writes refused on fd %s (%s); writing buffered", self.fd, e)
                    self.direct = set_direct(self.fd, False)
            if not self.direct:
                _pwrite_all(self.fd, whole[:used], self._written)
        self._written += used
        self._used = 0


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], offset + done)
