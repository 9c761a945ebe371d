"""``CometLogger``: Lightning's Comet logger, started on first use instead of in its constructor."""

from __future__ import annotations

import random
from collections.abc import Callable

from typing_extensions import override

from lightning_resume._compat.lightning import CometLoggerStartedOnFirstUse


class CometLogger(CometLoggerStartedOnFirstUse):
    """Lightning's ``CometLogger`` that starts its experiment when Lightning first uses it.

    Takes the arguments of :class:`lightning.pytorch.loggers.CometLogger`. Lightning's logger starts
    the Comet experiment in its constructor (``comet_ml.start``), which reads the experiment key to
    continue (``COMET_EXPERIMENT_KEY``) right then. :class:`~lightning_resume.CometResume` sets that
    variable on a restart once it and the :class:`~lightning_resume.RunDir` exist, which is too late
    for a logger built before them: LightningCLI always builds the logger first. This logger starts
    at the first ``experiment`` (Lightning does that when ``fit`` starts), so any order works.

    Starting the experiment does not draw from Python's global ``random``: comet_ml names an offline
    archive ``<key>-<6 random letters>.zip`` with it, so after ``seed_everything`` every attempt of a
    resumed run would get the same name and overwrite the previous attempt's archive.

    Example::

        from lightning_resume.loggers import CometLogger

        trainer = Trainer(
            logger=CometLogger(project="mnist"),
            callbacks=[CometResume(), RunDir(root="runs"), RequeueCheckpoint()],
        )
    """

    @override
    def start_experiment(self, start: Callable[[], None]) -> None:
        seeded = random.getstate()
        random.seed()  # from the OS: a name of its own for this attempt's offline archive
        try:
            start()
        finally:
            random.setstate(seeded)
