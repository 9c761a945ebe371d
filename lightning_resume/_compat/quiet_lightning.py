"""``QuietLightning``: silence Lightning warnings that lightning_resume makes false, while it does.

- :data:`NOTHING_TO_RESUME`, while a ``RequeueCheckpoint`` is alive: Lightning says these whenever an
  ``OnExceptionCheckpoint`` is present and a fresh run has nothing to resume; the callback logs what
  it loads instead.
- :data:`NOT_RESUMABLE`, while ``RequeueCheckpoint`` puts plain loaders back at their batch: on a
  mid-epoch restart Lightning says the data loader "is not resumable", which is then false. For a
  loader that cannot be positioned the warning is true and stays.
- ``CSVLogger``'s "logs directory ... exists" for a log dir whose rows ``LocalLoggerResume`` keeps.

The filters match only these messages (from the Lightning module that gives them), and are removed
when their owner is garbage-collected (or by :meth:`QuietLightning.remove`).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

#: What to silence: a pattern of the module that warns ("": any) and patterns of its messages.
Quieted = tuple[str, tuple[str, ...]]
_LIGHTNING = r"(lightning\.pytorch|pytorch_lightning)"  # the unified and the standalone package
#: Lightning's checkpoint connector, on a fresh run with nothing to resume.
NOTHING_TO_RESUME: Quieted = (
    rf"{_LIGHTNING}\.trainer\.connectors\.checkpoint_connector",
    (
        r"`\.fit\(ckpt_path=None\)` was called without a model",
        r"\.fit\(ckpt_path=\"last\"\) is set, but there is no last checkpoint available",
    ),
)
#: Lightning's training epoch loop, on a mid-epoch restart with a loader without ``state_dict``.
NOT_RESUMABLE: Quieted = (
    rf"{_LIGHTNING}\.loops\.training_epoch_loop",
    (
        r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"
        r" not resumable",
    ),
)


def _remove(filters: list[Any]) -> None:
    # Removing an "ignore" filter needs no cache reset: ignored warnings are not recorded as seen.
    installed: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
    for item in filters:
        with contextlib.suppress(ValueError):
            installed.remove(item)


class QuietLightning:
    """Install the filters now; they go when ``owner`` is garbage-collected or :meth:`remove` is called.

    Args:
        owner: The object whose lifetime bounds the filters.
        which: What to silence (:data:`NOTHING_TO_RESUME`, :data:`NOT_RESUMABLE`, ...).
    """

    def __init__(self, owner: object, which: Quieted = NOTHING_TO_RESUME) -> None:
        module, messages = which
        before = list(warnings.filters)
        for message in messages:
            warnings.filterwarnings("ignore", message=message, module=module)
        added = [item for item in warnings.filters if item not in before]
        self._finalizer = weakref.finalize(owner, _remove, added)

    def remove(self) -> None:
        """Remove the filters now."""
        self._finalizer()
