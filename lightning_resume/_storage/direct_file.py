"""The writer step of a save in the process that writes it: the new version of a file written aside
(:class:`Aside`), sequentially past the page cache (``O_DIRECT``), with a buffered fallback.

Through the page cache a checkpoint costs twice: kernel time copying every byte, then training data
pushed out of the cache. Filesystems that refuse direct writes get buffered ones whose writeback starts
block by block (``sync_file_range``), so that the final fsync is short."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Protocol

from lightning_resume._storage.atomic import fsync_dir, temp_sibling
from lightning_resume._storage.manifest import Checksum, ChecksumWriter

log = logging.getLogger(__name__)

ALIGN = 4096  #: offsets and lengths of direct writes are multiples of this (512- and 4096-byte devices)
BLOCK = 8 << 20  #: bytes of each aligned buffer, i.e. of each direct write
DEPTH = 4  #: buffers per file: one is filled while the others are written

RECEIVE_PIECE = 4 << 20  #: bytes received, hashed and written at a time by :meth:`Aside.receive`
DEFAULT_BYTES = 64 << 20  #: a write speed measure: long enough for a steady speed, short for a command line
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # sync_file_range flags


class Pace(Protocol):
    """Decides, after each block handed to the disk, whether the writer rests (the writer process's)."""

    def after_block(self, nbytes: int, drain: Callable[[], None]) -> None:
        """``nbytes`` more were handed over; ``drain()`` waits until everything handed over is written."""


def new_buffer(depth: int = DEPTH) -> mmap.mmap:
    """``depth`` aligned ``BLOCK``-sized buffers for :class:`DirectFile` (1: no pipelining); reuse them."""
    return mmap.mmap(-1, max(1, depth) * BLOCK)


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
    """A write-only stream over ``fd`` (an empty file, not closed here), with ``O_DIRECT`` where ``direct``
    and allowed: an I/O thread writes one block of ``buffer`` (a :func:`new_buffer`) while the caller
    fills the next; ``pace`` hears of each. :meth:`finish` writes the rest and truncates the padding;
    :meth:`close` stops the I/O thread (call it before closing ``fd``, also after an error)."""

    def __init__(self, fd: int, buffer: mmap.mmap, direct: bool = True, pace: Pace | None = None) -> None:
        self.fd = fd
        self.size = 0
        self.direct = set_direct(fd, True) if direct else False
        whole = memoryview(buffer)
        self._slots = [whole[i * BLOCK : (i + 1) * BLOCK] for i in range(max(1, len(buffer) // BLOCK))]
        whole.release()
        self._pace = pace
        self._free = deque(range(len(self._slots)))
        self._current = self._free.popleft()
        self._used = 0
        self._written = 0
        self._io: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[Future[None], int]] = deque()
        self._behind: tuple[int, int] | None = None  # buffered mode: the block whose writeback runs

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < view.nbytes:
            n = min(BLOCK - self._used, view.nbytes - done)
            self._slots[self._current][self._used : self._used + n] = view[done : done + n]
            self._used += n
            done += n
            if self._used == BLOCK:
                self._hand_over()
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        """Nothing: :meth:`finish` writes the tail."""

    def finish(self) -> None:
        """Write what is still buffered and give the file its exact size (call before the fsync)."""
        if self._used:
            self._hand_over(last=True)
        self.drain()
        os.ftruncate(self.fd, self.size)  # drops the padding of the last direct write

    def drain(self) -> None:
        """Wait until every buffer handed over is written; raise the first write error."""
        while self._pending:
            future, slot = self._pending.popleft()
            self._free.append(slot)
            future.result()

    def close(self) -> None:
        """Stop the I/O thread (dropping unwritten buffers) and release the buffer; ``fd`` stays open."""
        if self._io is not None:
            self._io.shutdown(wait=True, cancel_futures=True)
            self._io = None
        self._pending.clear()
        for slot in self._slots:
            slot.release()

    def _hand_over(self, last: bool = False) -> None:
        slot, used, offset = self._current, self._used, self._written
        self._written += used
        self._used = 0
        if len(self._slots) == 1:
            self._write_block(slot, used, offset)
        else:
            if self._io is None:
                self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-resume-io")
            self._pending.append((self._io.submit(self._write_block, slot, used, offset), slot))
            if not self._free:
                future, free = self._pending.popleft()
                self._free.append(free)
                future.result()
            self._current = self._free.popleft()
        if self._pace is not None and not last:
            self._pace.after_block(used, self.drain)

    def _write_block(self, slot: int, used: int, offset: int) -> None:
        view = self._slots[slot]
        if self.direct:
            padded = -(-used // ALIGN) * ALIGN
            view[used:padded] = bytes(padded - used)
            try:
                _pwrite_all(self.fd, view[:padded], offset)
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                # The filesystem took the flag but not the write: go on through the page cache.
                log.debug("direct writes refused on fd %s (%s); writing buffered", self.fd, e)
                self.direct = set_direct(self.fd, False)
        _pwrite_all(self.fd, view[:used], offset)
        self._write_behind(offset, used)

    def _write_behind(self, offset: int, nbytes: int) -> None:
        """Start writing this block back, and wait for the one before: few dirty pages, a short fsync."""
        sync_file_range = _sync_file_range()
        if sync_file_range is None:
            return
        sync_file_range(self.fd, offset, nbytes, _WRITE)
        if self._behind is not None:
            sync_file_range(self.fd, *self._behind, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
        self._behind = (offset, nbytes)


@cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or ``None``; its errors are ignored (it is only a hint)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], offset + done)


class Aside:
    """The new version of ``target`` written beside it (a temporary sibling named with this pid, so that a
    kill's leftover is recognised; ``path``: there instead), every byte checksummed, fsynced when the
    ``with`` block ends, removed when it raises. ``commit.commit_file`` then puts it in place.

    Example::

        aside = Aside(target)
        with aside as out:
            write_archive(out, records)
        commit_file(aside, fields)
    """

    def __init__(
        self,
        target: str | Path,
        direct: bool = True,
        buffer: mmap.mmap | None = None,
        pace: Pace | None = None,
        path: Path | None = None,
    ) -> None:
        self.target, self.path = Path(target), path
        self._direct, self._buffer, self._pace = direct, buffer, pace
        self.size, self.checksum, self.fsync_seconds = 0, "", 0.0

    def __enter__(self) -> ChecksumWriter:
        if self.path is None:
            self._fd, self.path = temp_sibling(self.target)
        else:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._staging = self._buffer if self._buffer is not None else new_buffer()
        self._file = DirectFile(self._fd, self._staging, self._direct, self._pace)
        self._out = ChecksumWriter(self._file)
        return self._out

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        written = False
        try:
            if kind is None:
                self._file.finish()
                started = time.monotonic()
                os.fsync(self._fd)
                self.fsync_seconds, written = time.monotonic() - started, True
        finally:
            self._file.close()
            os.close(self._fd)
            if self._staging is not self._buffer:
                # After a failed write the traceback may still hold views of it: then the GC frees it.
                with contextlib.suppress(BufferError):
                    self._staging.close()
            if not written:
                self.discard()
        self.size, self.checksum = self._out.checksum.size, self._out.checksum.hexdigest()

    def receive(self, recv_into: Callable[[memoryview], int], size: int) -> None:
        """Instead of the ``with`` block, for bytes arriving from another node: ``size`` of them, each piece
        received by ``recv_into`` (a socket's) into one reused buffer, hashed while it is in the CPU cache,
        written on (no other copy, no thread), then fsynced; ``EOFError`` when they stop short."""
        self._fd, self.path = temp_sibling(self.target)
        checksum = Checksum()
        piece = memoryview(bytearray(min(size, RECEIVE_PIECE) or 1))
        try:
            while checksum.size < size:
                got = recv_into(piece[: size - checksum.size])
                if got == 0:
                    raise EOFError(f"{checksum.size} of {size} bytes arrived")
                checksum.update(piece[:got])
                _pwrite_all(self._fd, piece[:got], checksum.size - got)
            os.fsync(self._fd)
        except BaseException:
            os.close(self._fd)
            self.discard()
            raise
        os.close(self._fd)
        self.size, self.checksum = checksum.size, checksum.hexdigest()

    def discard(self) -> None:
        """Remove what was written (a write that failed, or a copy that differs from its original)."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def measure_write_speed(directory: str | Path, nbytes: int = DEFAULT_BYTES, direct: bool = True) -> float:
    """Write ``nbytes`` of random data into ``directory`` as checkpoints are written (past the page cache
    where ``direct`` and allowed), fsync, remove it; return bytes per second (``ValueError`` for
    ``nbytes`` <= 0, ``OSError``). Named with this pid: a kill's leftover is removed by the next save."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes!r}.")
    block = os.urandom(min(nbytes, BLOCK))  # incompressible, so compressing filesystems show their disk
    aside = Aside(Path(directory) / "write-speed", direct, new_buffer())
    started = time.monotonic()
    try:
        with aside as out:
            for offset in range(0, nbytes, len(block)):
                out.write(block[: nbytes - offset])
        return nbytes / max(time.monotonic() - started, 1e-9)
    finally:
        aside.discard()
        fsync_dir(directory)
