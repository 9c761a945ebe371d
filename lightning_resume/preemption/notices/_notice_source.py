"""``NoticeSource``: the base of every notice source; it owns ``poll()``, which never raises."""

from __future__ import annotations

import time
import urllib.error
from typing import ClassVar, Literal

from lightning_resume._checks import positive_number
from lightning_resume.preemption.notices._notice import Notice


class NoticeSource:
    """Something that warns before a preemption: a cloud's metadata server, the scheduler, a file.

    :class:`~lightning_resume.PreemptionHandler` polls every source that :meth:`applies` from a thread of
    its own, every :attr:`interval` seconds. :meth:`poll` never raises: an error (no answer within
    :attr:`timeout`, a refused connection, an error status, an unreadable answer) is kept in
    :attr:`last_error` and the poll returns ``None``; the handler warns once per source. A source of your
    own sets :attr:`name` (and :attr:`scope` for a job-wide source) and implements ``_poll(now)``, which
    may raise; ``applies()`` is ``True`` unless overridden.

    Args:
        interval: Seconds between two polls.
        timeout: Seconds to wait for one answer.

    Raises:
        TypeError: ``interval`` or ``timeout`` is not a number.
        ValueError: ``interval`` or ``timeout`` is not positive.

    Example::

        class SpotFleetNotice(NoticeSource):
            name = "my-fleet"

            def _poll(self, now: float) -> Notice | None:
                answer = my_fleet_client.interruption()  # may raise: poll() keeps the error
                return Notice(self.name, "terminate", deadline=answer.time) if answer else None
    """

    #: The name in notices and log lines.
    name: ClassVar[str] = "notice"
    #: ``"node"``: a notice about this machine, polled by the first process of each node;
    #: ``"job"``: about the whole job, polled by global rank 0 only.
    scope: ClassVar[Literal["node", "job"]] = "node"
    #: ``True``: a notice, once given, stands (an empty answer later does not take it back);
    #: ``False``: each answer replaces the last, and an empty one (not a failed poll) takes it back.
    standing: ClassVar[bool] = True

    def __init__(self, interval: float = 5.0, timeout: float = 1.0) -> None:
        self.interval = positive_number("interval", interval, "number of seconds")
        self.timeout = positive_number("timeout", timeout, "number of seconds")
        #: Why the latest poll failed, or why its answer was only partly usable; ``None`` when it went well.
        self.last_error: str | None = None

    def applies(self) -> bool:
        """Whether this source can give notices here (checked without any network call)."""
        return True

    def poll(self) -> Notice | None:
        """The notice this source gives now, or ``None`` (none, or the poll failed: see :attr:`last_error`).

        Never raises; waits at most about :attr:`timeout` seconds per request.
        """
        self.last_error = None
        try:
            return self._poll(time.time())
        except Exception as e:  # a notice source must never stop training: the error is kept instead
            self.last_error = self._reason(e)
            return None

    def _poll(self, now: float) -> Notice | None:
        """Ask the source once (``now``: ``time.time()`` of this poll). May raise."""
        raise NotImplementedError(f"{type(self).__name__} must implement _poll(now)")

    def _next_poll_in(self) -> float:
        """Seconds until the next poll (:attr:`interval`; a source may ask for sooner)."""
        return self.interval

    def describe(self) -> str:
        """Where the source reads its notices from, for log lines."""
        return self.name

    def _reason(self, error: Exception) -> str:
        if isinstance(error, urllib.error.URLError):
            error = error.reason if isinstance(error.reason, Exception) else error
        if isinstance(error, TimeoutError):
            return f"no answer within {self.timeout:g} s"
        if isinstance(error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(error, ValueError):
            return str(error)  # an answer the source could not read: its own words
        return f"{type(error).__name__}: {error}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"
