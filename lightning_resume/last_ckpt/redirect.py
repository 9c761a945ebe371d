"""The restart redirect: on a restart, ``fit`` starts over, refuses, or loads this run's ``last.ckpt``
(:class:`RedirectFirstLoad` steps into ``strategy.load_checkpoint``, which reads it after ``setup``)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from lightning_resume._collectives import broadcast
from lightning_resume._compat.lightning import NextLoad, report_checkpoint_path, resume_even_if_none
from lightning_resume._warnings import warn
from lightning_resume.exceptions import ResumeError
from lightning_resume.io.durable_checkpoint_io import copies_elsewhere
from lightning_resume.last_ckpt.restart import Restart, decide, exists, record_saved
from lightning_resume.run_dir import layout, own_hparams

if TYPE_CHECKING:
    from lightning_resume.run_dir.run_dir import RunDir

log = logging.getLogger(__name__)


class RestartRedirect:
    """Apply the restart rule in ``setup`` and redirect the first load; undo it after ``fit``."""

    def __init__(self) -> None:
        self._wrapper: NextLoad | None = None
        self._undo_resume: Callable[[], None] | None = None

    def before_fit(
        self,
        trainer: pl.Trainer,
        run: RunDir,
        last: Path,
        verify_directory: Callable[[], tuple[int, Path]],
        damaged: Callable[[Path], bool],
    ) -> None:
        """On a restart (every rank, in ``setup``): start over, raise ``ResumeError`` or redirect to ``last``;
        ``verify_directory`` picks what a sharded restart reads, ``damaged`` tells a file beyond fallback."""
        if not run.is_resumed:
            return
        # Rank 0 decides for all: a node-local view of the checkpoints must not split the ranks.
        searched, copy = elsewhere(trainer, last) if trainer.is_global_zero else ("", None)
        restart = Restart(broadcast(trainer.strategy, decide(run.path, last, copy).value))
        if restart is Restart.START_OVER:
            log.info(
                "Restart of run %s, which stopped before its first checkpoint: starting from the beginning",
                run.run_id,
            )
            return
        if restart is Restart.LOST:
            nowhere = f", and no copy of it is in {searched}" if searched else ""
            raise ResumeError(
                f"This is a restart of run {run.run_id!r}, but {str(last)!r} does not exist although the run "
                f"has saved checkpoints ({str(layout.saves_record(run.path))!r} says so){nowhere}. Starting "
                "over would silently discard the run. Restore last.ckpt from a copy, or submit with another "
                "key to start a new run.",
                last,
            )
        if trainer.is_global_zero:
            record_saved(run.path)  # a run dir written before the marker existed gets it now
        world_size = saved = trainer.world_size
        source = last
        if broadcast(trainer.strategy, last.is_dir()):
            # A sharded checkpoint: verified here, as no CheckpointIO sees its load.
            (saved, source), damaged = verify_directory(), _never_damaged
        redirected = functools.partial(_redirected, trainer, str(last))
        allowed = functools.partial(own_hparams.recorded_globals, run.path)
        load = RedirectFirstLoad(str(last), redirected, saved, world_size, damaged, allowed, str(source))
        self._wrapper = NextLoad(trainer.strategy, load)
        self._wrapper.install()
        # Lightning chose no checkpoint when last.ckpt is not here: fit restores from it all the same.
        self._undo_resume = resume_even_if_none(trainer, str(last))
        if copy is not None:
            log.info("Restart of run %s: resuming from %s (no %s)", run.run_id, copy, last)
        else:
            log.info("Restart of run %s: resuming from %s", run.run_id, last)

    def after_fit(self) -> None:
        """Take the wrapper away if ``fit`` ended before its load (a no-op after the load)."""
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            wrapper.uninstall()
        undo, self._undo_resume = self._undo_resume, None
        if undo is not None:
            undo()


def elsewhere(trainer: pl.Trainer, last: Path) -> tuple[str, str | None]:
    """Without ``last``: the plugin's other tiers searched (``""``: none) and a committed copy, if any."""
    if exists(last):
        return "", None
    return copies_elsewhere(trainer.strategy.checkpoint_io, last)


def _redirected(trainer: pl.Trainer, target: str, requested: str) -> None:
    # Lightning then logs "Restored all states from the checkpoint at <target>", not the requested one.
    report_checkpoint_path(trainer, target)
    warn(
        f"Restart of a preempted run: resuming from {target!r} instead of {requested!r} "
        "(a ckpt_path given to fit() only applies to the first attempt of a run).",
        all_ranks=True,
    )


def _never_damaged(path: Path) -> bool:
    return False


@dataclass(eq=False)
class RedirectFirstLoad:
    """What the strategy's first ``load_checkpoint`` does instead (through ``NextLoad``): load ``target``."""

    target: str
    on_redirect: Callable[[str], None]  # given the requested path, when it differs
    saved_world_size: int  # a load failure with another world size is a ResumeError
    world_size: int
    damaged: Callable[[Path], bool] = _never_damaged
    allowed: Callable[[], Mapping[str, Any]] = dict  # types the load may unpickle (own_hparams)
    source: str | None = None  # what is read for ``target`` when that differs (a memory tier's copy)

    def __call__(
        self,
        original: Callable[..., Any],
        checkpoint_path: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        if os.path.abspath(str(checkpoint_path)) != os.path.abspath(self.target):
            self.on_redirect(str(checkpoint_path))
        try:
            loaded = own_hparams.load(original, self.source or self.target, args, kwargs, self.allowed)
        except Exception as e:
            refused = own_hparams.refusal(self.target, e, self.allowed())
            if refused is not None:
                raise ResumeError(refused, self.target) from e
            if self.saved_world_size != self.world_size:
                raise ResumeError(
                    f"{self.target!r} was written by {self.saved_world_size} rank(s) and cannot be loaded "
                    f"on {self.world_size} rank(s) ({type(e).__name__}: {e}). Restart with "
                    f"{self.saved_world_size} rank(s), or with a layout torch.distributed.checkpoint can "
                    "reshard into.",
                    self.target,
                ) from e
            if not self.damaged(Path(self.target)):
                raise
            raise ResumeError(
                f"The restart cannot load {self.target!r}: it is damaged (loading raised {type(e).__name__}; "
                "it is not a complete checkpoint archive). It was written without DurableCheckpointIO, so "
                "there is no verified copy to fall back to. Restore it from a copy, or remove it and "
                "saves.json from the run dir to start the run over (the earlier training is then lost). "
                "DurableCheckpointIO verifies every checkpoint and keeps the previous one loadable.",
                self.target,
            ) from e
        return loaded
