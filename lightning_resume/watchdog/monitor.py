"""A per-rank watchdog thread: acts when the main thread reports no progress within its section's timeout.
A report replaces one immutable :class:`Progress` (no lock); a :class:`Backstop` covers a held GIL."""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from lightning_resume.watchdog.timeouts import Section


@dataclass(frozen=True)
class Progress:
    """What the main thread last reported."""

    section: Section
    step: int | None  # None before training
    since: float  # time.monotonic() when the section began or last made progress
    timeout: float  # seconds it may go without progress
    until: Callable[[], bool] | None = None  # stop watching once this returns True

    @property
    def deadline(self) -> float:
        return self.since + self.timeout


class Backstop:
    """faulthandler's C-level timer, kept armed ``MARGIN`` past the Python watchdog's deadline; re-arming
    starts a thread (~50 us), so it is armed for twice that and re-armed only when a deadline comes close."""

    #: Seconds after the Python watchdog's deadline that the backstop fires.
    MARGIN = 60.0

    def __init__(self, file: IO[Any] | None = None) -> None:
        self._file = file if file is not None else _stderr()
        self._fires_at: float | None = None

    def keep_after(self, deadline: float) -> None:
        """Make sure the backstop fires no earlier than ``deadline + MARGIN`` (``time.monotonic()``)."""
        if self._file is None:
            return
        wanted = deadline + self.MARGIN
        if self._fires_at is not None and self._fires_at >= wanted:
            return
        now = time.monotonic()
        window = 2 * (wanted - now)
        faulthandler.dump_traceback_later(window, exit=True, file=self._file)
        self._fires_at = now + window

    def cancel(self) -> None:
        if self._fires_at is not None:
            faulthandler.cancel_dump_traceback_later()
            self._fires_at = None


def _stderr() -> IO[Any] | None:
    """The process's standard error, if it is a real file descriptor (faulthandler writes to one)."""
    stream = sys.__stderr__
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if stream is not None:
            stream.fileno()
            return stream
    return None


class Watchdog:
    """A daemon thread that calls ``on_hang(progress, seconds)`` once when progress is overdue (it should
    end the process), looking at least every ``poll`` seconds; ``backstop`` keeps a :class:`Backstop`."""

    def __init__(
        self, on_hang: Callable[[Progress, float], None], poll: float = 0.5, backstop: bool = True
    ) -> None:
        self._on_hang = on_hang
        self._poll = poll
        self._progress: Progress | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop = Backstop() if backstop else None
        self.fired: Progress | None = None

    def report(self, progress: Progress | None) -> None:
        """Replace the progress the thread watches (``None``: watch nothing until the next report)."""
        self._progress = progress
        watching = self._thread is not None and not self._stop.is_set()  # cheaper than asking the thread
        if progress is not None and self._backstop is not None and watching:
            self._backstop.keep_after(progress.deadline)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="lightning-resume-watchdog", daemon=True)
        self._thread.start()
        self.report(self._progress)  # arms the backstop for what was reported before

    def stop(self) -> None:
        """Stop watching and end the thread (it is not waited for if it is acting on a hang)."""
        self._progress = None
        self._stop.set()
        if self._backstop is not None:
            self._backstop.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self.fired is None:
            thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called (the thread may have ended since)."""
        return self._thread is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            progress = self._progress
            if progress is None:
                self._stop.wait(self._poll)
                continue
            if progress.until is not None and progress.until():
                if self._progress is progress:  # nothing left to watch: the thread ends
                    self._progress = None
                    self._stop.set()
                    if self._backstop is not None:
                        with contextlib.suppress(Exception):
                            self._backstop.cancel()
                    return
                continue
            now = time.monotonic()
            if now < progress.deadline:
                self._stop.wait(min(progress.deadline - now, self._poll))
                continue
            if self._progress is not progress:
                continue  # progress was made while we looked
            self.fired = progress
            self._on_hang(progress, now - progress.since)
            return
