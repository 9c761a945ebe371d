"""How ``last.ckpt`` is written (chosen at each ``fit``'s first save: a ``DirectorySaver``, a plugin that
``writes_atomically``, else a renamed ``.last.ckpt.partial``) and what a restart needs to know of it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl

from lightning_resume._collectives import barrier
from lightning_resume._compat.lightning import saves_directory
from lightning_resume._storage.archive import intact_zip
from lightning_resume._storage.atomic import fsync_file, replace_durably, temp_sibling
from lightning_resume._storage.commit import save_error
from lightning_resume.io._protocol import AtomicCheckpointIO, MemoryTierLifecycle
from lightning_resume.io.durable_checkpoint_io import memory_tier_of
from lightning_resume.io.settings import settings_of
from lightning_resume.io.sharded.choice import clean_leftovers, prepare_resume
from lightning_resume.io.sharded.saver import DirectorySaver


def lost_save(partial: Path) -> OSError:
    """The error for a save Lightning reported done but did not write (its plugin hides some errors)."""
    try:
        fd, probe = temp_sibling(partial)
    except OSError as e:
        error = save_error(e.errno, e.strerror or str(e), e.filename, partial)
        error.__cause__ = e
        return error
    os.close(fd)
    probe.unlink()
    return OSError(
        f"Lightning's checkpoint writer returned without writing {str(partial)!r} (it hides some errors). "
        "last.ckpt is intact; check the checkpoint directory's permissions and free space, or use "
        "DurableCheckpointIO, which reports the real error."
    )


def memory_tier(trainer: pl.Trainer) -> MemoryTierLifecycle | None:
    """The memory tier of the trainer's checkpoint plugin, if it has one."""
    return memory_tier_of(trainer.strategy.checkpoint_io)


class LastCkptWrites:
    """The writes of ``last.ckpt`` at ``path()``; ``on_commit(trainer)``: a sharded save committed later."""

    def __init__(self, path: Callable[[], Path], on_commit: Callable[[pl.Trainer], None]) -> None:
        self._path = path
        self._on_commit = on_commit
        self._write: Callable[[pl.Trainer], None] | None = None  # the route, chosen at the first save
        self._saver: DirectorySaver | None = None  # sharded strategies: checkpoint directories

    @property
    def _partial(self) -> Path:
        last = self._path()
        return last.with_name(f".{last.name}.partial")

    def writer(self, trainer: pl.Trainer) -> DirectorySaver | None:
        """What writes the next save where the plugin does not (a sharded strategy's saver), if anything."""
        if self._write is None:
            self._write = self._choose(trainer)
        return self._saver

    def _choose(self, trainer: pl.Trainer) -> Callable[[pl.Trainer], None]:
        if saves_directory(trainer.strategy) is not False:
            self._saver = DirectorySaver.for_trainer(
                trainer, self._path(), on_commit=lambda: self._on_commit(trainer)
            )
            return self._saver.save
        io = trainer.strategy.checkpoint_io
        if isinstance(io, AtomicCheckpointIO) and io.writes_atomically:
            return lambda trainer: trainer.save_checkpoint(self._path(), weights_only=False)
        return self._through_partial_file

    def write(self, trainer: pl.Trainer) -> None:
        """Write the Trainer's checkpoint as ``last.ckpt`` (every rank)."""
        if self._write is None:
            self._write = self._choose(trainer)
        self._write(trainer)

    def _through_partial_file(self, trainer: pl.Trainer) -> None:
        partial = self._partial
        trainer.save_checkpoint(partial, weights_only=False)
        if trainer.is_global_zero:
            if not partial.is_file():
                raise lost_save(partial)
            fsync_file(partial)
            replace_durably(partial, self._path())

    def wait_until_durable(self, trainer: pl.Trainer) -> None:
        """Block until every write in flight is on disk (every rank)."""
        io = trainer.strategy.checkpoint_io
        if isinstance(io, AtomicCheckpointIO):
            io.wait_until_durable()
        if self._saver is not None:
            self._saver.wait_until_durable(trainer)

    @staticmethod
    def attach_memory(trainer: pl.Trainer, durable_dir: Path) -> None:
        """Introduce the nodes of a plugin's memory tier (every rank, in ``setup``)."""
        if (tier := memory_tier(trainer)) is not None:
            tier.attach(trainer.strategy, durable_dir)

    def close(self, trainer: pl.Trainer, collective: bool) -> None:
        """Finish a sharded save in flight and (``collective``: every rank at once) the memory tier."""
        saver, self._saver, self._write = self._saver, None, None
        if saver is not None:  # first: its writer thread may still send replicas to the other nodes
            saver.close(trainer, collective=collective)
        if collective and (tier := memory_tier(trainer)) is not None:
            tier.settle()
            barrier(trainer.strategy, "lightning_resume memory tier")
            tier.close()

    def remove_partial(self, trainer: pl.Trainer) -> None:
        """Remove a ``.last.ckpt.partial`` a killed attempt left (rank 0)."""
        if trainer.is_global_zero:
            with contextlib.suppress(FileNotFoundError):
                self._partial.unlink()

    def written_by(self, trainer: pl.Trainer) -> tuple[int, Path]:
        """What a sharded restart loads (every rank; a memory tier's newer copy first): world size, path."""
        kept = settings_of(trainer.strategy.checkpoint_io).directories_kept
        tier = memory_tier(trainer)
        restored = tier.restore_sharded(trainer, self._path()) if tier is not None else None
        if restored is not None:
            clean_leftovers(trainer, self._path(), kept)
            return restored
        choice = prepare_resume(trainer, self._path(), kept)
        world = trainer.world_size if choice.manifest is None else choice.manifest.world_size
        return world, self._path()

    @staticmethod
    def damaged(trainer: pl.Trainer) -> Callable[[Path], bool]:
        """A file that fails to load is damaged, unless the plugin explains its failures or it is intact."""
        explains = isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
        return lambda path: not explains and not intact_zip(path)
