"""The process's exit status after ``fit`` raised: the failure class's instead of Python's 1, set by a
``sys.excepthook`` that calls the one before it, then raises ``SystemExit`` when the uncaught exception is
(or was raised from) the one armed, remembered by identity and type (no reference keeps its frames)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import TracebackType
from typing import Any


def chain(exception: BaseException) -> Iterator[BaseException]:
    """``exception``, then what caused it (``__cause__``, else ``__context__``), and so on."""
    seen: set[int] = set()
    current: BaseException | None = exception
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


class ExitHook:
    """A ``sys.excepthook`` that ends the process with the status armed for one exception."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._armed: tuple[int, type[BaseException], int] | None = None

    @property
    def armed(self) -> int | None:
        return self._armed[2] if self._armed is not None else None

    def arm(self, exception: BaseException, exit_code: int) -> None:
        """Exit with ``exit_code`` when ``exception`` (or one raised from it) reaches the top uncaught."""
        if sys.excepthook is not self:
            self._previous, sys.excepthook = sys.excepthook, self
        self._armed = (id(exception), type(exception), exit_code)

    def disarm(self) -> None:
        """Put back the hook that was there before :meth:`arm` (when no other replaced ours since)."""
        if sys.excepthook is self:
            sys.excepthook = self._previous or sys.__excepthook__
        self._previous = self._armed = None

    def __call__(self, kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        armed, previous = self._armed, self._previous or sys.__excepthook__
        self.disarm()
        previous(kind, value, trace)
        if armed is not None and any(id(e) == armed[0] and type(e) is armed[1] for e in chain(value)):
            raise SystemExit(armed[2])  # raised by an excepthook: Python exits with this status


#: The process's one hook.
EXIT_HOOK = ExitHook()
