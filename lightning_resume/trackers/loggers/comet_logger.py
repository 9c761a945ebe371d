"""``CometLogger``: Lightning's Comet logger, started on first use instead of in its constructor."""

from __future__ import annotations

import random
from collections.abc import Callable

from typing_extensions import override

from lightning_resume._compat.lightning import CometLoggerStartedOnFirstUse


class CometLogger(CometLoggerStartedOnFirstUse):
    """Lightning's ``CometLogger`` that starts its experiment when Lightning first uses it.

    Takes the arguments of :class:`lightning.pytorch.loggers.CometLogger`. Lightning's logger reads
    ``COMET_EXPERIMENT_KEY`` in its constructor, before :class:`~lightning_resume.CometResume` can set it
    when the logger is built first (LightningCLI always does); this one starts when ``fit`` does.

    Starting does not draw from the global ``random``: comet_ml names offline archives with it, so
    after ``seed_everything`` every attempt would overwrite the previous attempt's archive.

    Example::

        from lightning_resume.loggers import CometLogger

        callbacks = [CometResume(), RunDir(root="runs"), RequeueCheckpoint()]
        trainer = Trainer(logger=CometLogger(project="mnist"), callbacks=callbacks)
    """

    @override
    def start_experiment(self, start: Callable[[], None]) -> None:
        seeded = random.getstate()
        random.seed()  # from the OS: a name of its own for this attempt's offline archive
        try:
            start()
        finally:
            random.setstate(seeded)
