"""``OwnCheckpointLoad``: ``validate``/``test``/``predict`` load the run's files by :mod:`.own_hparams`."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_resume._compat.lightning import NextLoad
from lightning_resume.run_dir import own_hparams


class OwnCheckpointLoad(NextLoad):
    """Apply the rule to the strategy's next ``load_checkpoint`` of a file of the run (:meth:`owns`)."""

    def __init__(self, trainer: pl.Trainer, run_dir: Path) -> None:
        super().__init__(trainer.strategy, self._load)
        self.trainer = trainer
        self.run_dir = run_dir

    def owns(self, path: str) -> bool:
        """Whether ``path`` is a file of this run: in its run dir or a ``ModelCheckpoint``'s ``dirpath``."""
        if "://" in path:
            return False
        folders = [self.run_dir]
        folders += [
            Path(cb.dirpath)
            for cb in self.trainer.checkpoint_callbacks
            if isinstance(cb, ModelCheckpoint) and cb.dirpath
        ]
        where = Path(os.path.realpath(path))
        return any(where.is_relative_to(os.path.realpath(folder)) for folder in folders)

    def _allowed(self) -> dict[str, Any]:
        return own_hparams.own_globals(self.trainer, self.run_dir)

    def _load(
        self,
        original: Callable[..., Any],
        checkpoint_path: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        path = str(checkpoint_path)
        if not self.owns(path):
            return dict(original(checkpoint_path, *args, **kwargs))
        try:
            return own_hparams.load(original, path, args, kwargs, self._allowed)
        except Exception as e:
            module = self.trainer.lightning_module
            owner = type(module).__name__ if module is not None else "the module"
            why = own_hparams.refusal(path, e, self._allowed(), owner)
            if why is None:
                raise
            raise pickle.UnpicklingError(why) from e
