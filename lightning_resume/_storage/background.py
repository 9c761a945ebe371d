"""One daemon thread running the mirror's queued jobs in order: a daemon, so that a preempted job that
stops waiting for its uploads can still exit (an executor's threads are joined at exit)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

_Job = tuple[Callable[[], None], "Future[None]"]


class Background:
    """Run jobs one after the other in a daemon thread (named ``name``), started on the first job."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._waiting: set[Hashable] = set()
        self._futures: list[Future[None]] = []
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def submit(self, job: Callable[[], None], key: Hashable | None = None) -> None:
        """Queue ``job``, unless a job of the same ``key`` is queued and not started yet."""
        with self._lock:
            if key is not None:
                if key in self._waiting:
                    return
                self._waiting.add(key)
            if self._worker is None or not self._worker.is_alive():
                self._jobs = queue.SimpleQueue()
                self._worker = threading.Thread(target=_run, args=(self._jobs,), name=self.name, daemon=True)
                self._worker.start()
            future: Future[None] = Future()
            self._futures = [*(f for f in self._futures if not f.done()), future]

            def started() -> None:
                with self._lock:
                    self._waiting.discard(key)
                job()

            self._jobs.put((started, future))

    @property
    def pending(self) -> int:
        return sum(not f.done() for f in self._futures)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the queued jobs (raising what one raised); return how many still run after ``timeout``."""
        with self._lock:
            futures = list(self._futures)
        done, not_done = wait_futures(futures, timeout=timeout)
        for future in done:
            future.result()
        return len(not_done)

    def stop(self) -> None:
        """Stop the thread after the job it runs; jobs not started are cancelled."""
        with self._lock:
            if self._worker is not None:
                self._jobs.put(None)
            self._worker = None
            self._waiting.clear()
            for future in self._futures:
                future.cancel()


def _run(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (item := jobs.get()) is not None:
        job, future = item
        if not future.set_running_or_notify_cancel():
            continue
        try:
            job()
        except BaseException as e:
            future.set_exception(e)
        else:
            future.set_result(None)
