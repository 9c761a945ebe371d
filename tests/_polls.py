"""Positive signs for "nothing happened" assertions: a count of a notice source's polls, and a bounded wait.

A test that asserts an absence (no second warning, a notice that stays) first waits until the code under
test has run a known number of times more; never a bare sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], seconds: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (``True``) or ``seconds`` passed (``False``)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Polls:
    """Counts the polls of a notice source (the poller calls ``source.poll()``, found on the instance)."""

    def __init__(self, source: Any) -> None:
        self.count, self._poll = 0, source.poll
        source.poll = self

    def __call__(self) -> Any:
        found = self._poll()
        self.count += 1
        return found

    def more(self, polls: int, seconds: float = 30.0) -> bool:
        """Wait until ``polls`` more polls have returned (``False``: not within ``seconds``)."""
        target = self.count + polls
        return wait_for(lambda: self.count >= target, seconds)
