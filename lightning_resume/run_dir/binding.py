"""Where callbacks meet the run dir of their process, whatever order they were constructed in: ``RunDir``
announces its choice to :data:`PROCESS`, a tracker callback waits on it with :meth:`Binding.when_ready`."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from lightning_resume.run_dir.resolve import Resolution


class Binding:
    """The run dir of this process, and the callbacks waiting for it (weakly held: never a discarded one)."""

    def __init__(self) -> None:
        self._current: Resolution | None = None
        self._waiting: list[weakref.WeakMethod[Callable[[Resolution], None]]] = []

    def announce(self, resolution: Resolution) -> None:
        """Record the run dir and call everything waiting for it."""
        self._current = resolution
        waiting, self._waiting = self._waiting, []
        for ref in waiting:
            method = ref()
            if method is not None:
                method(resolution)

    @property
    def current(self) -> Resolution | None:
        """The run dir the latest ``RunDir`` of this process chose, if any."""
        return self._current

    def when_ready(self, method: Callable[[Resolution], None]) -> None:
        """Call bound ``method`` with the run dir now, or as soon as a ``RunDir`` is constructed."""
        if self._current is not None:
            method(self._current)
        else:
            self._waiting.append(weakref.WeakMethod(method))

    def reset(self) -> None:
        """Forget the run dir and the waiting callbacks (a new, independent job in this process)."""
        self._current = None
        self._waiting = []


#: The binding of this process (tests reset it in an autouse fixture).
PROCESS = Binding()
