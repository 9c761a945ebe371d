"""``QuietLightning``: silence two misleading Lightning warnings while a ``RequeueCheckpoint`` is alive.

Lightning says these whenever an ``OnExceptionCheckpoint`` is present and a fresh run has nothing
to resume; with ``RequeueCheckpoint`` they would be misleading (it logs what it loads instead).
The filters match only these messages, only when Lightning's checkpoint connector gives them, and
are removed when the callback is garbage-collected (or by :meth:`QuietLightning.remove`).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

# Lightning's checkpoint connector, in the unified and the standalone package.
_MODULE = r"(lightning\.pytorch|pytorch_lightning)\.trainer\.connectors\.checkpoint_connector"
_MESSAGES = (
    r"`\.fit\(ckpt_path=None\)` was called without a model",
    r"\.fit\(ckpt_path=\"last\"\) is set, but there is no last checkpoint available",
)


def _remove(filters: list[Any]) -> None:
    # Removing an "ignore" filter needs no cache reset: ignored warnings are not recorded as seen.
    installed: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
    for item in filters:
        with contextlib.suppress(ValueError):
            installed.remove(item)


class QuietLightning:
    """Install the filters now; they go when ``owner`` is garbage-collected or :meth:`remove` is called."""

    def __init__(self, owner: object) -> None:
        before = list(warnings.filters)
        for message in _MESSAGES:
            warnings.filterwarnings("ignore", message=message, module=_MODULE)
        added = [item for item in warnings.filters if item not in before]
        self._finalizer = weakref.finalize(owner, _remove, added)

    def remove(self) -> None:
        """Remove the filters now."""
        self._finalizer()
