"""The checkpoint writer process: writes staged checkpoints from shared memory and commits them.

Pickled tuples over a socket pair: ``("hello", {})`` -> ``("ready", pid)``; ``("write", request)`` ->
``("done", {"entry", "stats"})`` or ``("error", details)``; ``("exit", None)`` -> ``("bye", None)``.
It ignores the preemption signals (the trainer still has a last checkpoint to hand over)."""

from __future__ import annotations

import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from lightning_resume._storage.commit import save_error, write_file
from lightning_resume._storage.direct_file import new_buffer
from lightning_resume._storage.manifest import Entry
from lightning_resume._writer.duty_cycle import DutyCycle, WriteStats, hurry
from lightning_resume._writer.zip_records import write_archive

log = logging.getLogger(__name__)

_MAIN = Path(__file__).with_name("main.py")
_POLL = 0.2


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


START_TIMEOUT = 120.0  #: seconds a new writer has to report ready (it starts in milliseconds)
SHUTDOWN_TIMEOUT = 60.0  #: seconds the writer has to exit when asked, before it is killed


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


def write_request(
    request: dict[str, Any], view: memoryview, buffer: mmap.mmap | None = None, hurry_fd: int | None = None
) -> tuple[Entry, WriteStats]:
    """Write and commit a staged checkpoint whose records point into ``view``; return its entry and stats."""
    records = [
        (name, view[source[1] : source[1] + source[2]] if source[0] == "shm" else source[1])
        for name, source in request["records"]
    ]
    pace = DutyCycle(request.get("share", 1.0), hurry_fd, request.get("seq", 0))
    entry = write_file(
        request["path"],
        lambda out: write_archive(out, records, request["alignment"], request["version"]),
        lambda size, checksum: Entry.from_json({**request["entry"], "size": size, "checksum": checksum}),
        Entry.from_json(request["known"]) if request.get("known") else None,
        direct=request.get("direct", True),
        buffer=buffer,
        pace=pace,
    )
    return entry, pace.stats(entry.size)


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
                    entry, stats = write_request(payload, view, file_buffer, hurry_fd)
                reply = ("done", {"entry": entry.to_json(), "stats": stats.to_json()})
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
