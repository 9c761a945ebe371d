"""``NoticeWatch``: the notice side of ``PreemptionHandler``: which sources this process polls, what they
ask for at each check, what was done about them (no Lightning, no collectives)."""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

from lightning_resume._warnings import warn
from lightning_resume.io._protocol import HurryingCheckpointIO
from lightning_resume.preemption.notices._notice import Notice, format_time
from lightning_resume.preemption.notices._notice_source import NoticeSource
from lightning_resume.preemption.notices._notices import Notices
from lightning_resume.preemption.notices._policy import Act, decide, expected_seconds_to_durable, stop_time
from lightning_resume.preemption.notices._poller import NoticePoller

log = logging.getLogger(__name__)

#: The recent intervals between checks whose maximum is the expected next one.
PERIOD_WINDOW = 8


@dataclass
class NoticeRecord:
    """What was done about the notice acted on (times are ``time.time()``)."""

    notice: Notice
    decided: float  # when the ranks agreed to act on it
    saved_step: int | None = None  # the step of its save while training went on
    notice_to_durable: float | None = None  # seconds from the notice (time limit: decision) to durable
    durable: float | None = None  # when that save was durable
    last_durable: float | None = None  # when the newest save after the notice was durable

    def steps_gained(self, final_step: int | None) -> int:
        """Steps trained after the notice's save and kept by the final one (0 when it stopped at once)."""
        if self.saved_step is None or final_step is None:
            return 0
        return max(0, final_step - self.saved_step)

    def durable_after(self, durable: float, seconds: float) -> None:
        """Record a save after the notice (``seconds``: from its decision until it was durable)."""
        self.last_durable = durable
        if self.notice_to_durable is not None:
            return
        timed_from_notice = self.notice.received and not self.notice.is_time_limit
        since = self.notice.received if timed_from_notice else self.decided
        self.notice_to_durable = max(seconds, durable - since)
        self.durable = durable

    def describe(self, final_step: int | None) -> str:
        """``notice aws-spot (terminate, deadline ...): last.ckpt durable 0.300 s after it, ...``."""
        parts = [
            f"last.ckpt durable {self.notice_to_durable or 0.0:.3f} s after it",
            f"{self.steps_gained(final_step)} steps gained after it",
        ]
        if self.last_durable is not None and self.notice.deadline is not None:
            parts.append(
                f"the last save durable {self.notice.deadline - self.last_durable:.1f} s before the deadline"
            )
        return f"notice {self.notice.describe()}: " + ", ".join(parts)


class NoticeWatch:
    """The notices of one ``PreemptionHandler``: sources, poller, decisions and their record."""

    def __init__(self, notices: Notices | None) -> None:
        notices = notices if notices is not None else Notices(None)
        self.sources = notices.resolved()
        self.auto, self.on_notice, self.margin = notices.auto, notices.on_notice, notices.margin
        self.poller: NoticePoller | None = None
        self.record: NoticeRecord | None = None
        self.measured: float | None = None  # the longest time to durable of the saves made for notices
        self.recorded: float | None = None  # the run's, from its attempt history (before any measurement)
        self._last_check: float | None = None
        self._periods: collections.deque[float] = collections.deque(maxlen=PERIOD_WINDOW)

    def start(self, local_rank: int, global_rank: int, recorded: float | None) -> None:
        """Poll this rank's sources where they apply (``recorded``: the run's time to durable, if known)."""
        self.stop()
        self.record, self.measured, self._last_check = None, None, None  # a new fit
        self.recorded = recorded
        self._periods.clear()
        # Node-wide sources on each node's local rank 0, job-wide ones on global rank 0.
        mine = [s for s in self.sources if (global_rank if s.scope == "job" else local_rank) == 0]
        polled = [source for source in mine if _applies(source)]
        for source in mine:
            if source not in polled and not self.auto:
                log.info("notice source %s does not apply on this machine: not polled", source.describe())
        if polled:
            self.poller = NoticePoller(polled)
            self.poller.start()
            log.info("preemption notices polled here: %s", ", ".join(source.describe() for source in polled))

    def stop(self) -> None:
        if self.poller is not None:
            self.poller.stop()
            self.poller = None

    def wanted(self, checkpoint_io: object) -> tuple[Act, Notice | None]:
        """What the notices seen by this process ask for now."""
        if self.poller is None:
            return Act.NONE, None  # the common case, once per batch: nothing to compute
        now = time.monotonic()
        if self._last_check is not None:
            self._periods.append(now - self._last_check)
        self._last_check = now
        notices = self.poller.notices()
        if not notices:
            return Act.NONE, None
        return decide(
            notices,
            now=time.time(),
            seconds_to_durable=self.seconds_to_durable(checkpoint_io),
            margin=self.margin,
            period=max(self._periods, default=0.0),
            on_notice=self.on_notice,
            saved=self.record is not None and self.record.saved_step is not None,
        )

    def seconds_to_durable(self, checkpoint_io: object) -> float:
        return expected_seconds_to_durable(self.measured, _written(checkpoint_io), recorded=self.recorded)

    def acting_on(self, notice: Notice) -> NoticeRecord:
        """The record of the first notice the ranks act on (begun now for ``notice`` if none is)."""
        if self.record is None:
            self.record = NoticeRecord(notice, decided=time.time())
        return self.record

    def saved(self, notice: Notice, step: int, seconds: float) -> NoticeRecord:
        """Record the save made for ``notice`` while training goes on (``seconds``: until durable)."""
        record = self.acting_on(notice)
        record.saved_step = step
        record.durable_after(time.time(), seconds)
        self.measured = max(self.measured or 0.0, seconds)
        self._last_check = None  # the save is no interval between two steps
        return record

    def describe_save(self, record: NoticeRecord, checkpoint_io: object) -> str:
        """The log line of a save for a notice: what, when durable, until when training goes on."""
        notice = record.notice
        until = "a preemption signal"
        if notice.deadline is not None:
            seconds = self.seconds_to_durable(checkpoint_io)
            stop = stop_time(notice.deadline, seconds, self.margin)
            until = (
                f"about {format_time(stop)} (the deadline less {seconds:.1f} s to durable and the "
                f"{self.margin:g} s margin) or a preemption signal"
            )
        before = ""
        if notice.deadline is not None and record.durable is not None:
            before = f" and {notice.deadline - record.durable:.1f} s before the deadline"
        return (
            f"Preemption notice from {notice.describe()}: last.ckpt durable at step {record.saved_step}, "
            f"{record.notice_to_durable or 0.0:.3f} s after the notice{before}; "
            f"training goes on until {until}"
        )


def _written(checkpoint_io: object) -> float | None:
    """Seconds the checkpoint plugin's newest save took to be written, if the plugin says."""
    write = checkpoint_io.last_write if isinstance(checkpoint_io, HurryingCheckpointIO) else None
    return write.seconds if write is not None else None


def _applies(source: NoticeSource) -> bool:
    try:
        return source.applies()
    except Exception as e:  # detection reads files; a source of the user's may do more: never fatal
        warn(f"Notice source {source.describe()}: applies() failed ({e!r}): not polled.", all_ranks=True)
        return False
