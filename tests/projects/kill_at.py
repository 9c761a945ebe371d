"""``KillAt``: the test's way to interrupt a project's training, added by a Hydra override
(``+callbacks.kill._target_=kill_at.KillAt +callbacks.kill.step=N``), not part of the project."""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning.pytorch as pl

#: Where ``KillAt`` may strike: the hooks it watches.
HOOKS = ("on_train_batch_end", "on_validation_batch_end", "on_train_epoch_start")


class KillAt(pl.Callback):
    """Send this process ``how`` (``SIGKILL`` or ``SIGTERM``) at the first ``hook`` once ``step``
    optimizer steps are done.

    ``on_train_batch_end`` (the default): right after the step. Callbacks run in list order with
    Lightning's checkpoint callbacks last, so a save due at ``step`` has not happened yet: the restart
    resumes from the save before it. ``on_validation_batch_end``: in the validation after that step
    (the one at the epoch's end). ``on_train_epoch_start``: at the start of the next epoch, after the
    epoch-end save.
    """

    def __init__(self, step: int, how: str = "SIGKILL", hook: str = "on_train_batch_end") -> None:
        if hook not in HOOKS:
            raise ValueError(f"KillAt(hook={hook!r}): one of {HOOKS}")
        self.step = step
        self.signal = signal.Signals[how]
        self.hook = hook

    def _strike(self, trainer: pl.Trainer, hook: str) -> None:
        if hook == self.hook and trainer.global_step == self.step and not trainer.sanity_checking:
            os.kill(os.getpid(), self.signal)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._strike(trainer, "on_train_batch_end")

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._strike(trainer, "on_validation_batch_end")

    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._strike(trainer, "on_train_epoch_start")
