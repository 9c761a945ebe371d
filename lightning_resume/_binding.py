"""Where callbacks meet the run dir of their process, whatever order they were constructed in.

``RunDir`` announces its choice when it is constructed. A callback that must act before ``fit``
(a tracker that has to be told which run to continue before the logger creates one) registers with
:func:`when_ready`: it is called at once if a ``RunDir`` already exists, or when one is constructed.
Only weak references to bound methods are kept, so a discarded callback is never called.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from lightning_resume._resolve import Resolution

_current: Resolution | None = None
_waiting: list[weakref.WeakMethod[Callable[[Resolution], None]]] = []


def announce(resolution: Resolution) -> None:
    """Record this process's run dir and call everything waiting for it."""
    global _current
    _current = resolution
    waiting = list(_waiting)
    _waiting.clear()
    for ref in waiting:
        method = ref()
        if method is not None:
            method(resolution)


def current() -> Resolution | None:
    """The run dir the latest ``RunDir`` of this process chose, if any."""
    return _current


def when_ready(method: Callable[[Resolution], None]) -> None:
    """Call bound ``method`` with the run dir now, or as soon as a ``RunDir`` is constructed."""
    if _current is not None:
        method(_current)
    else:
        _waiting.append(weakref.WeakMethod(method))
