"""The checkpoint writer process: writes staged checkpoints from shared memory and commits them, paced.

Pickled tuples over a socket pair: ``("hello", {})`` -> ``("ready", pid)``; ``("write", request)`` ->
``("done", {"entry", "stats", "pruned"})`` or ``("error", details)``; ``("exit", None)`` -> ``("bye",
None)``. It ignores the preemption signals (the trainer still has a last checkpoint to hand over).

Two speeds: a gentle write works for about 50 ms, waits for the disk, then rests ``(1 - share) / share``
times as long; the trainer lifts the pacing through a pipe (:meth:`WriterProcess.hurry`). Not a nice
value: a niced process cannot be un-niced without privileges, and it starves on a busy node just when a
preemption needs it."""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from lightning_resume._storage.archive import write_archive
from lightning_resume._storage.commit import commit_file, save_error
from lightning_resume._storage.direct_file import Aside, new_buffer
from lightning_resume._storage.manifest import Entry

log = logging.getLogger(__name__)

_MAIN = Path(__file__).with_name("main.py")
_POLL = 0.2
QUANTUM = 0.05  #: seconds of work between two rests of a gentle write
_MESSAGE = 8  # bytes per hurry message: a little-endian sequence number
START_TIMEOUT = 120.0  #: seconds a new writer has to report ready (it starts in milliseconds)
SHUTDOWN_TIMEOUT = 60.0  #: seconds the writer has to exit when asked, before it is killed


class WriterDied(RuntimeError):
    """The writer process exited or closed its end of the connection."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in the writer process, chained to the error re-raised here."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


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
    """A writer process inheriting the staging buffer ``buffer_fd``, started with a readiness ping."""

    def __init__(self, buffer_fd: int) -> None:
        parent, child = socket.socketpair()
        hurry_read, self._hurry_write = os.pipe()
        os.set_blocking(self._hurry_write, False)
        self._hurry_lock = threading.Lock()  # hurry() runs in the trainer's thread, kill() in the saver's
        try:
            fds = (child.fileno(), buffer_fd, hurry_read)
            self.process = subprocess.Popen(
                [sys.executable, str(_MAIN), *map(str, fds)], pass_fds=fds, stdin=subprocess.DEVNULL
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
    """Paces one write (working ``share`` of the time) until a hurry message or the trainer's exit."""

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
        """``nbytes`` more were handed to the disk; rest if this work period is over."""
        self._handed += nbytes
        if not self.gentle or self._hurried(0.0) or time.monotonic() - self._period < self._quantum:
            return
        drain()  # the rest must be a rest of the disk too
        worked = time.monotonic() - self._period
        self._rest(worked * (1 - self.share) / self.share)
        self._period = time.monotonic()

    def stats(self, nbytes: int, fsync_seconds: float = 0.0) -> dict[str, Any]:
        """The fields of ``WriteStats`` (``lightning_resume.WriteStats``) for this write."""
        seconds = time.monotonic() - self._start
        return {
            "nbytes": nbytes,
            "seconds": seconds,
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
        if select.select([self._hurry_fd], [], [], timeout)[0]:
            try:
                data = os.read(self._hurry_fd, 512 * _MESSAGE)
            except BlockingIOError:
                data = None
            if data == b"":  # the trainer is gone: nobody to be gentle with, and the save must land
                self._full_speed()
            elif data:
                starts = range(0, len(data), _MESSAGE)
                if max(int.from_bytes(data[i : i + _MESSAGE], "little") for i in starts) >= self._seq:
                    self._full_speed()
        return not self.gentle

    def _full_speed(self) -> None:
        if self.gentle:
            self.gentle = False
            self.hurried_after = self._handed


def write_request(
    request: dict[str, Any], view: memoryview, buffer: mmap.mmap | None = None, hurry_fd: int | None = None
) -> dict[str, Any]:
    """Format, write and commit a staged checkpoint whose records point into ``view`` (the steps after
    the snapshot, in order); return the reply: its entry, how it was written, what retention removed."""
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


def _describe(error: BaseException) -> dict[str, Any]:
    details = {name: getattr(error, name, None) for name in ("errno", "strerror", "filename")}
    details.update(type=type(error).__name__, message=str(error), traceback=traceback.format_exc())
    return details


def serve(sock_fd: int, buffer_fd: int, hurry_fd: int | None = None) -> None:
    for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if hurry_fd is not None:
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
                reply = ("error", _describe(e))
        else:
            reply = ("error", {"type": "ValueError", "message": f"unknown request {kind!r}", "traceback": ""})
        try:
            conn.send(reply)
        except OSError:
            return
        if kind == "exit":
            return
