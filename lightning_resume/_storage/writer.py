"""The writer step of a save: a file's new version written aside (:class:`Aside`) past the page cache (which
costs copies and evicts training data), in the caller or in the torch-free writer process (:func:`serve`)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from lightning_resume._storage.archive import write_archive
from lightning_resume._storage.atomic import fsync_dir, temp_sibling
from lightning_resume._storage.commit import commit_file, save_error
from lightning_resume._storage.manifest import Checksum, ChecksumWriter, Entry

log = logging.getLogger(__name__)

ALIGN = 4096  #: offsets and lengths of direct writes are multiples of this (512- and 4096-byte devices)
BLOCK = 8 << 20  #: bytes of each aligned buffer, i.e. of each direct write
DEPTH = 4  #: buffers per file: one is filled while the others are written

RECEIVE_PIECE = 4 << 20  #: bytes received, hashed and written at a time by :meth:`Aside.receive`
DEFAULT_BYTES = 64 << 20  #: a write speed measure: long enough for a steady speed, short for a command line
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # sync_file_range flags


class Pace(Protocol):
    """After each block of ``nbytes`` handed to the disk, whether to rest (``drain()`` waits for the disk)."""

    def after_block(self, nbytes: int, drain: Callable[[], None]) -> None: ...


def new_buffer(depth: int = DEPTH) -> mmap.mmap:
    """``depth`` aligned ``BLOCK``-sized buffers for :class:`DirectFile` (1: no overlap); reuse them."""
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
    """A write-only stream over the empty file ``fd`` (``O_DIRECT`` where ``direct`` and allowed): an I/O
    thread writes one block of ``buffer`` while the caller fills the next. Close before ``fd``."""

    def __init__(self, fd: int, buffer: mmap.mmap, direct: bool = True, pace: Pace | None = None) -> None:
        self.fd = fd
        self.size = 0
        self.direct = direct and set_direct(fd, True)
        with memoryview(buffer) as whole:
            self._slots = [whole[i * BLOCK : (i + 1) * BLOCK] for i in range(max(1, len(buffer) // BLOCK))]
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
            self._wait_oldest()

    def _wait_oldest(self) -> None:
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
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-resume-io")
        self._pending.append((self._io.submit(self._write_block, slot, used, offset), slot))
        if not self._free:
            self._wait_oldest()
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
    """``target``'s new version in a temporary sibling named with this pid (``path``: there instead), every
    byte checksummed, fsynced as the ``with`` block ends, removed if it raises; ``commit_file`` commits it."""

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
        """Instead of the ``with`` block: ``size`` bytes from another node, ``recv_into`` one reused buffer,
        each piece hashed while in the CPU cache and written on, then fsynced (``EOFError``: they stopped)."""
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
    """Bytes per second of writing ``nbytes`` of random data into ``directory`` as a checkpoint (``Aside``:
    a kill's leftover is removed by the next save), fsynced, removed (``ValueError`` for ``nbytes`` <= 0)."""
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


# -- the writer process ------------------------------------------------------------------------------

#: The writer process's start: a bare package object stands in for ``lightning_resume``, whose
#: ``__init__`` would import torch; the current directory leaves the path (it must not shadow modules).
_BOOT = f"""import sys, types
if not getattr(sys.flags, "safe_path", False):
    del sys.path[0]
package = types.ModuleType("lightning_resume")
package.__path__ = [{str(Path(__file__).parent.parent)!r}]
sys.modules["lightning_resume"] = package
from lightning_resume._storage.writer import serve
serve(*map(int, sys.argv[1:]))
"""

_POLL = 0.2
QUANTUM = 0.05  #: seconds of work between two rests of a gentle write
_MESSAGE = 8  # bytes per hurry message: a little-endian sequence number
START_TIMEOUT = 120.0  #: seconds a new writer has to report ready (it starts in milliseconds)
SHUTDOWN_TIMEOUT = 60.0  #: seconds the writer has to exit when asked, before it is killed


class WriterDied(RuntimeError):
    """The writer process exited or closed its end of the connection."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in the writer process, chained to the error re-raised here."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


def carried_error(details: dict[str, Any], path: str | Path) -> BaseException:
    """Rebuild an error the writer reported for a save of ``path`` as an exception to raise here."""
    err = details.get("errno")
    if err is not None:
        error: BaseException = save_error(err, details.get("strerror") or "", details.get("filename"), path)
    else:
        error = RuntimeError(
            f"Could not save checkpoint {str(path)!r}: the writer process raised "
            f"{details.get('type')}: {details.get('message')}. The previous checkpoint is intact."
        )
    error.__cause__ = RemoteTraceback(details.get("traceback", ""))
    return error


class WriterProcess:
    """A writer process inheriting the staging buffer ``buffer_fd``, started with a readiness ping.
    Pickled tuples over a socket pair: hello -> ready, write -> done or error, exit -> bye."""

    def __init__(self, buffer_fd: int) -> None:
        parent, child = socket.socketpair()
        hurry_read, self._hurry_write = os.pipe()
        os.set_blocking(self._hurry_write, False)
        self._hurry_lock = threading.Lock()  # hurry() runs in the trainer's thread, kill() in the saver's
        try:
            fds = (child.fileno(), buffer_fd, hurry_read)
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, *map(str, fds)], pass_fds=fds, stdin=subprocess.DEVNULL
            )
        except BaseException:
            os.close(self._hurry_write)
            raise
        finally:
            child.close()
            os.close(hurry_read)
        self.conn = Connection(parent.detach())
        log.debug("started checkpoint writer process %s", self.process.pid)
        try:
            kind, _ = self.request(("hello", {}), timeout=START_TIMEOUT)
            if kind != "ready":
                raise WriterDied(f"the checkpoint writer process answered {kind!r} to its readiness ping")
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def hurry(self, seq: int) -> None:
        """Have the writer finish write ``seq`` (if it is writing it) at full speed; never blocks."""
        with self._hurry_lock:
            if self._hurry_write >= 0:
                hurry(self._hurry_write, seq)

    def request(self, message: tuple[str, Any], timeout: float | None = None) -> tuple[str, Any]:
        """Send ``message`` and wait for the reply (``WriterDied``; ``TimeoutError``, leaving it running)."""
        try:
            self.conn.send(message)
        except OSError as e:
            raise self._died() from e
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if self.conn.poll(_POLL):
                    return self.conn.recv()
            except (EOFError, OSError) as e:
                raise self._died() from e
            if not self.alive():
                raise self._died()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"The checkpoint writer process {self.pid} did not answer within {timeout:g} s "
                    f"(request {message[0]!r})."
                )

    def _died(self) -> WriterDied:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return WriterDied(f"the checkpoint writer process {self.pid} exited (status {code})")

    def close(self) -> None:
        """Ask the writer to exit; kill it if it has not after ``SHUTDOWN_TIMEOUT`` seconds."""
        if self.alive():
            try:
                self.request(("exit", None), timeout=SHUTDOWN_TIMEOUT)
                self.process.wait(timeout=SHUTDOWN_TIMEOUT)
            except (WriterDied, TimeoutError, subprocess.TimeoutExpired):
                if self.alive():
                    log.warning(
                        "checkpoint writer process %s did not exit within %s s; killing it",
                        self.pid,
                        SHUTDOWN_TIMEOUT,
                    )
        self.kill()

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()
        self.conn.close()
        with self._hurry_lock:
            if self._hurry_write >= 0:
                os.close(self._hurry_write)
                self._hurry_write = -1


# -- in the writer process ---------------------------------------------------------------------------


def hurry(fd: int, seq: int) -> None:
    """Ask the writer reading the pipe ``fd`` to finish write ``seq`` at full speed; never blocks."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, seq.to_bytes(_MESSAGE, "little"))


class DutyCycle:
    """Paces a write until hurried or the trainer exits: ``quantum`` s of work, a wait for the disk, a rest
    ``(1 - share) / share`` times as long. Not nice(): never undone unprivileged, it starves when hurried."""

    def __init__(
        self, share: float = 1.0, hurry_fd: int | None = None, seq: int = 0, quantum: float = QUANTUM
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be within (0, 1], got {share!r}.")
        self.share = share
        self.gentle = share < 1
        self.hurried_after: int | None = None
        self.rested = 0.0
        self._hurry_fd = hurry_fd
        self._seq = seq
        self._quantum = quantum
        self._handed = 0
        self._start = self._period = time.monotonic()

    def after_block(self, nbytes: int, drain: Callable[[], None]) -> None:
        self._handed += nbytes
        if not self.gentle or self._hurried(0.0) or time.monotonic() - self._period < self._quantum:
            return
        drain()  # the rest must be a rest of the disk too
        worked = time.monotonic() - self._period
        self._rest(worked * (1 - self.share) / self.share)
        self._period = time.monotonic()

    def stats(self, nbytes: int, fsync_seconds: float = 0.0) -> dict[str, Any]:
        """The fields of ``WriteStats`` (``lightning_resume.WriteStats``) for this write."""
        return {
            "nbytes": nbytes,
            "seconds": time.monotonic() - self._start,
            "fsync_seconds": fsync_seconds,
            "share": self.share,
            "hurried_after": self.hurried_after,
            "rested_seconds": self.rested,
        }

    def _rest(self, seconds: float) -> None:
        start = time.monotonic()
        deadline = start + seconds
        while self.gentle and (left := deadline - time.monotonic()) > 0:
            self._hurried(left)
        self.rested += time.monotonic() - start

    def _hurried(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a hurry message; whether the write is at full speed now."""
        if self._hurry_fd is None:
            if timeout > 0:
                time.sleep(timeout)
            return not self.gentle
        if select.select([self._hurry_fd], [], [], timeout)[0]:  # called while gentle only
            with contextlib.suppress(BlockingIOError):
                data = os.read(self._hurry_fd, 512 * _MESSAGE)
                starts = range(0, len(data), _MESSAGE)
                newest = max((int.from_bytes(data[i : i + _MESSAGE], "little") for i in starts), default=-1)
                # No data: the trainer is gone, nobody to be gentle with, and the save must land.
                if not data or newest >= self._seq:
                    self.gentle = False
                    self.hurried_after = self._handed
        return not self.gentle


def write_request(
    request: dict[str, Any], view: memoryview, buffer: mmap.mmap | None = None, hurry_fd: int | None = None
) -> dict[str, Any]:
    """Format, write and commit (in order) a staged checkpoint whose records point into ``view``."""
    records = [
        (name, view[source[1] : source[1] + source[2]] if source[0] == "shm" else source[1])
        for name, source in request["records"]
    ]
    pace = DutyCycle(request.get("share", 1.0), hurry_fd, request.get("seq", 0))
    aside = Aside(request["path"], request.get("direct", True), buffer, pace)
    with aside as out:
        write_archive(out, records, request["alignment"], request["version"])
    known = Entry.from_json(request["known"]) if request.get("known") else None
    entry, pruned = commit_file(aside, request["entry"], known, request.get("keep"))
    return {"entry": entry.to_json(), "stats": pace.stats(entry.size, aside.fsync_seconds), "pruned": pruned}


def serve(sock_fd: int, buffer_fd: int, hurry_fd: int) -> None:
    """The writer process; it ignores preemption signals (the trainer still has a checkpoint to hand over)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    os.set_blocking(hurry_fd, False)
    conn = Connection(sock_fd)
    mapping: mmap.mmap | None = None
    file_buffer = new_buffer()
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return  # the trainer is gone
        if kind == "hello":
            reply: tuple[str, Any] = ("ready", os.getpid())
        elif kind == "exit":
            reply = ("bye", None)
        elif kind == "write":
            try:
                if mapping is None or len(mapping) < payload["buffer_size"]:
                    if mapping is not None:
                        mapping.close()
                    mapping = mmap.mmap(buffer_fd, payload["buffer_size"], prot=mmap.PROT_READ)
                with memoryview(mapping) as view:
                    reply = ("done", write_request(payload, view, file_buffer, hurry_fd))
            except Exception as e:
                details = {name: getattr(e, name, None) for name in ("errno", "strerror", "filename")}
                details.update(type=type(e).__name__, message=str(e), traceback=traceback.format_exc())
                reply = ("error", details)
        else:
            reply = ("error", {"type": "ValueError", "message": f"unknown request {kind!r}", "traceback": ""})
        try:
            conn.send(reply)
        except OSError:
            return
        if kind == "exit":
            return
