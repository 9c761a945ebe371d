"""``NoticePoller``: one daemon thread that polls the notice sources and keeps what they say."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

from lightning_resume._warnings import warn
from lightning_resume.preemption.notices._notice import Notice
from lightning_resume.preemption.notices._notice_source import NoticeSource

log = logging.getLogger(__name__)

#: Failed polls in a row before the warning: one lost answer is no reason for alarm.
FAILURES_TO_WARN = 3


class NoticePoller:
    """Polls each source every ``source.interval`` s on a daemon thread, keeping its newest notice."""

    def __init__(self, sources: Sequence[NoticeSource]) -> None:
        self.sources = list(sources)
        self._notices: dict[int, Notice] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failures = [0] * len(self.sources)  # failed polls in a row, by source
        self._thread = threading.Thread(target=self._run, name="lightning-resume-notices", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 0.0) -> None:
        """Stop polling; wait up to ``wait`` seconds for a poll in flight (the thread is a daemon)."""
        self._stop.set()
        if wait > 0 and self._thread.is_alive():
            self._thread.join(wait)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def notices(self) -> list[Notice]:
        """The notices given so far, one per source at most."""
        with self._lock:
            return list(self._notices.values())

    def _run(self) -> None:
        due = [0.0] * len(self.sources)  # monotonic time of each source's next poll
        while not self._stop.is_set():
            for index, source in enumerate(self.sources):
                if time.monotonic() >= due[index] and not self._stop.is_set():
                    self._poll(index, source)
                    due[index] = time.monotonic() + source._next_poll_in()
            self._stop.wait(max(0.0, min(due) - time.monotonic()))

    def _poll(self, index: int, source: NoticeSource) -> None:
        notice = source.poll()
        self._failures[index] = self._failures[index] + 1 if source.last_error is not None else 0
        if self._failures[index] == FAILURES_TO_WARN and not self._stop.is_set():
            warn(
                f"Preemption notices from {source.describe()}: {source.last_error} ({FAILURES_TO_WARN} polls "
                "in a row). Training goes on; this source's notices are missed while this lasts (warned "
                "once). Fix it, or leave the source out with PreemptionHandler(notices=Notices([...])).",
                all_ranks=True,
            )
        elif source.last_error is not None:
            log.debug("notice source %s: %s", source.describe(), source.last_error)
        if notice is None:  # takes a notice back only when the source is not standing and answered
            if not source.standing and source.last_error is None:
                with self._lock:
                    taken_back = self._notices.pop(index, None)
                if taken_back is not None:
                    log.info("notice %s taken back by %s", taken_back.describe(), source.describe())
            return
        with self._lock:
            earlier = self._notices.get(index)
            if earlier is None:
                log.debug("notice from %s: %s", source.describe(), notice.describe())
            else:  # first seen then
                notice = dataclasses.replace(notice, received=earlier.received)
            self._notices[index] = notice
