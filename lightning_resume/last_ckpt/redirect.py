"""The restart redirect: on a restart, ``fit`` starts over, refuses, or loads this run's ``last.ckpt``.

Lightning picks the checkpoint to load before any callback hook runs (a ``ckpt_path`` meant for the
first attempt, its own ``last`` search, an ``hpc_ckpt_N.ckpt`` under SLURM); ``setup`` runs before that
checkpoint is read. :class:`RestartRedirect` applies the restart rule there (:mod:`.restart`, rank 0
deciding for all) and puts :class:`RedirectFirstLoad` in the way of the load: Lightning reads the
checkpoint through ``strategy.load_checkpoint`` once per ``fit`` (every strategy, also the sharded ones,
which call no ``CheckpointIO``); the wrapper sends that call to ``last.ckpt`` and removes itself.
That load may unpickle what the module's own hyperparameters are made of (:mod:`.own_hparams`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import lightning.pytorch as pl

from lightning_resume._collectives import broadcast
from lightning_resume._compat.lightning import NextLoad, report_checkpoint_path
from lightning_resume._warnings import warn
from lightning_resume.exceptions import ResumeError
from lightning_resume.last_ckpt.restart import Restart, decide, record_saved
from lightning_resume.run_dir import own_hparams

log = logging.getLogger(__name__)


class Run(Protocol):
    """The run being restarted (a ``RunDir``)."""

    @property
    def path(self) -> Path: ...
    @property
    def run_id(self) -> str: ...
    @property
    def is_resumed(self) -> bool: ...


class RestartRedirect:
    """Apply the restart rule in ``setup`` and redirect the first load; undo it after ``fit``."""

    def __init__(self) -> None:
        self._wrapper: NextLoad | None = None

    def before_fit(
        self,
        trainer: pl.Trainer,
        run: Run,
        last: Path,
        verify_directory: Callable[[], int],
        damaged: Callable[[Path], bool],
    ) -> None:
        """Nothing on a first attempt; on a restart start over, raise, or send the first load to ``last``.

        Args:
            trainer: The trainer, in ``setup`` of ``fit`` (call on every rank).
            run: The run dir.
            last: The run's ``last.ckpt``.
            verify_directory: For a sharded ``last.ckpt``: verify it on every rank (falling back and
                repointing ``last.ckpt`` if it must) and return how many ranks wrote it.
            damaged: For a ``last.ckpt`` file that fails to load: whether it is damaged, with no
                verified copy to fall back to (``False`` when the plugin explains its own failures).

        Raises:
            ResumeError: the run has committed a checkpoint but ``last.ckpt`` is gone.
        """
        if not run.is_resumed:
            return
        # Rank 0 decides for all: a node-local view of the checkpoints must not split the ranks.
        restart = Restart(broadcast(trainer.strategy, decide(run.path, last).value))
        if restart is Restart.START_OVER:
            # The previous attempt stopped before its first save (say, preempted while loading data):
            # there is nothing to resume and nothing to lose by starting over in the same run dir.
            log.info(
                "Restart of run %s, which stopped before its first checkpoint: starting from the beginning",
                run.run_id,
            )
            return
        if restart is Restart.LOST:
            raise ResumeError(
                f"This is a restart of run {run.run_id!r}, but {str(last)!r} does not exist "
                "although the run has saved checkpoints. Starting over would silently discard the run. "
                "Restore last.ckpt from a copy, or submit with another key to start a new run.",
                last,
            )
        if trainer.is_global_zero:
            record_saved(run.path)  # a run dir written before the marker existed gets it now
        world_size = saved = trainer.world_size
        if broadcast(trainer.strategy, last.is_dir()):
            # A sharded checkpoint: verified here, as no CheckpointIO sees its load.
            saved, damaged = verify_directory(), _never_damaged
        on_redirect = functools.partial(_redirected, trainer, str(last))
        self._wrapper = NextLoad(
            trainer.strategy,
            RedirectFirstLoad(
                str(last),
                on_redirect,
                saved,
                world_size,
                damaged,
                allowed=functools.partial(own_hparams.trainer_hparams_globals, trainer),
                owner=own_hparams.owner_name(trainer),
            ),
        )
        self._wrapper.install()
        log.info("Restart of run %s: resuming from %s", run.run_id, last)

    def after_fit(self) -> None:
        """Take the wrapper away if ``fit`` ended before its load (a no-op after the load)."""
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            wrapper.uninstall()


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


class RedirectFirstLoad:
    """What the strategy's first ``load_checkpoint`` does instead: load ``target`` (through
    :class:`~lightning_resume._compat.lightning.NextLoad`).

    Args:
        target: The checkpoint every first load is redirected to (``last.ckpt``).
        on_redirect: Called with the requested path when it differs from ``target``.
        saved_world_size: How many ranks wrote ``target``; a load failure on a different number of
            ranks is reported as a :class:`~lightning_resume.ResumeError` naming both.
        world_size: How many ranks this run has.
        damaged: Whether ``target``, having failed to load, is damaged (a
            :class:`~lightning_resume.ResumeError` then says what to do) rather than failing for
            another reason.
        allowed: The types the load may unpickle beyond torch's ``weights_only`` set: those of the
            module's own hyperparameters (:mod:`~lightning_resume.run_dir.own_hparams`).
        owner: The module's class name, for the message when the load needs other types.
    """

    def __init__(
        self,
        target: str,
        on_redirect: Callable[[str], None],
        saved_world_size: int,
        world_size: int,
        damaged: Callable[[Path], bool] = _never_damaged,
        allowed: Callable[[], Mapping[str, Any]] = dict,
        owner: str = "the module",
    ) -> None:
        self.target = target
        self.on_redirect = on_redirect
        self.saved_world_size = saved_world_size
        self.world_size = world_size
        self.damaged = damaged
        self.allowed = allowed
        self.owner = owner

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
            loaded = own_hparams.load(original, self.target, args, kwargs, self.allowed)
        except Exception as e:
            refused = own_hparams.refusal(self.target, e, self.allowed(), self.owner)
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
                "checkpoints/.saved to start the run over (the earlier training is then lost). "
                "DurableCheckpointIO verifies every checkpoint and keeps the previous one loadable.",
                self.target,
            ) from e
        return loaded
