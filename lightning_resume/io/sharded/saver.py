"""``DirectorySaver``: sharded checkpoints written into a fresh directory and committed atomically
(asynchronous saves run ``dcp.save`` in a thread on a gloo group of its own)."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_resume._collectives import broadcast, cpu_group, gather_objects
from lightning_resume._compat.lightning import capture_checkpoint, saves_directory
from lightning_resume._storage.atomic import fsync_file, replace_durably, write_bytes_durably
from lightning_resume._storage.kinds import DirectoryKind, new_save_dir
from lightning_resume._storage.mirror import Mirroring
from lightning_resume._warnings import warn
from lightning_resume.io.durable_checkpoint_io import manifest_versions, memory_tier_of
from lightning_resume.io.settings import CheckpointSettings, settings_of
from lightning_resume.io.sharded import dcp, parts
from lightning_resume.io.sharded.in_memory import ShardedMemory
from lightning_resume.io.write_stats import WriteStats

log = logging.getLogger(__name__)

PART_TIMEOUT = 600.0  #: seconds global rank 0's writer thread waits for the other ranks' part files
_POLL = 0.01
_Action = Callable[[], None]


class DirectorySaver:
    """Write sharded checkpoints into fresh directories and commit them as ``pointer`` (every rank)."""

    def __init__(
        self,
        pointer: Path,
        settings: CheckpointSettings,
        mirror: Mirroring | None,
        on_commit: _Action,
        memory: ShardedMemory | None,
    ) -> None:
        self.pointer = pointer
        self.settings = settings
        self.keep = settings.directories_kept
        self.mirror = mirror  # global rank 0's
        self.on_commit = on_commit
        self.memory = memory  # the plugin's MemoryTier: saves into node memory
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._pending_dir: Path | None = None
        self._async_used = False  # identical on every rank: the same saves, the same settings
        self._group: Any = None
        self._stager: Any = None
        self._cleaned = False
        self._told_sync = False
        #: Global rank 0: how the newest committed save was written (a new object at every commit).
        self.last_write: WriteStats | None = None

    @classmethod
    def for_trainer(cls, trainer: pl.Trainer, pointer: Path, on_commit: _Action) -> DirectorySaver:
        settings = settings_of(trainer.strategy.checkpoint_io)
        mirror = _mirror(settings, pointer) if trainer.is_global_zero else None
        route = memory_tier_of(trainer.strategy.checkpoint_io)  # the plugin's memory tier drives ours
        memory = route.sharded(pointer) if route is not None else None
        return cls(pointer, settings, mirror, on_commit, memory)

    def save(self, trainer: pl.Trainer) -> None:
        """Save a new checkpoint directory and commit it (every rank); ``RuntimeError`` if any rank failed."""
        error, before = self._finish_pending()
        if trainer.is_global_zero and not self._cleaned:
            # Leftovers of processes that are gone; a restart cleaned up in setup already.
            parts.clean_up(self.pointer, self.keep)
            self._cleaned = True
        use_async = self.settings.asynchronous and self._supports_async(trainer.strategy)
        chosen = new_save_dir(self.pointer.parent, create=use_async) if trainer.is_global_zero else None
        # One gather, not two collectives: the save before failed on no rank, and rank 0's directory.
        save_dir = Path(self._agree(trainer, error, before, chosen) or "")
        if use_async:
            self._save_async(trainer, save_dir)
        else:
            self._save_now(trainer, save_dir)

    def _supports_async(self, strategy: Any) -> bool:
        if dcp.uses_dcp(strategy) and saves_directory(strategy):
            return True
        if not self._told_sync:
            self._told_sync = True
            log.info("%s writes its own checkpoints: saving synchronously", type(strategy).__name__)
        return False

    def _fields(self, trainer: pl.Trainer, writer: str) -> dict[str, Any]:
        return {
            "global_step": int(trainer.global_step),
            "epoch": int(trainer.current_epoch),
            "layout": dcp.layout_of(trainer.strategy, writer),
            "versions": manifest_versions(),
            "metadata": dict(self.settings.metadata),
        }

    def _save_now(self, trainer: pl.Trainer, save_dir: Path) -> None:
        strategy = trainer.strategy
        rank, world = trainer.global_rank, trainer.world_size
        with dcp.without_torch_crc32():  # our manifest checksums every file
            trainer.save_checkpoint(save_dir, weights_only=False)  # every rank; ends with a barrier
        if not broadcast(strategy, save_dir.is_dir()):
            # An unknown strategy wrote one file: commit it as a file.
            if trainer.is_global_zero:
                fsync_file(save_dir)
                replace_durably(save_dir, self.pointer)
            return
        self._agree(trainer, parts.attempt(lambda: self._record_part(save_dir, rank)), save_dir)
        error = None
        if trainer.is_global_zero:
            fields = self._fields(trainer, f"{type(strategy).__name__}.save_checkpoint")
            required = dcp.required_files(strategy)
            error = parts.attempt(partial(self._commit, save_dir, world, required, fields, time.monotonic()))
        self._agree(trainer, error, save_dir)

    def _save_async(self, trainer: pl.Trainer, save_dir: Path) -> None:
        strategy = trainer.strategy
        checkpoint = capture_checkpoint(trainer, save_dir)  # every rank; ends with a barrier
        state = dcp.dcp_state(strategy, checkpoint)
        scratch = self.memory.plan(trainer, state) if self.memory is not None else None
        if scratch is not None and trainer.is_global_zero:
            save_dir.rmdir()  # the save goes into node memory: no directory on the durable tier
        # Lightning's meta.pt, serialised now: it may hold live tensors.
        meta = _serialised(checkpoint) if trainer.is_global_zero else None
        if self._group is None:
            self._group = cpu_group(strategy)
        staged = self._stage(state)
        fields = self._fields(trainer, f"dcp.save in a thread ({dcp.model_key(strategy)})")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="lightning-resume-sharded")
        self._async_used = True
        required, rank = dcp.required_files(strategy), trainer.global_rank
        self._pending_dir = scratch or save_dir
        write = partial(self._write, staged, self._pending_dir)
        if scratch is not None:
            self._pending = self._pool.submit(
                self._finish_in_memory, write, scratch, meta, rank, fields, required
            )
            return
        commit = partial(self._commit, save_dir, trainer.world_size, required, fields, time.monotonic())
        self._pending = self._pool.submit(self._finish, write, save_dir, meta, rank, commit)

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` that later training steps do not change (on the training thread)."""
        from lightning_resume.io.sharded.stager import ReusedBufferStager

        if ReusedBufferStager.supports(state):
            if not isinstance(self._stager, ReusedBufferStager):
                self._stager = ReusedBufferStager()
            return self._stager.stage(state)
        # GPU-resident or unusual tensors: DCP's own stager (pinned where CUDA is), synchronous.
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if not isinstance(self._stager, DefaultStager):
            self._stager = DefaultStager(StagingOptions(torch.cuda.is_available(), False, False, False))
        staged = self._stager.stage(state)
        return staged.result() if isinstance(staged, Future) else staged

    def _write(self, staged: dict[str, Any], save_dir: Path) -> None:
        """DCP's save of the staged copy (the writer thread; what ``dcp.async_save``'s thread runs)."""
        from torch.distributed.checkpoint import save

        try:
            with dcp.without_torch_crc32():
                save(staged, checkpoint_id=save_dir, process_group=self._group, planner=dcp.save_planner())
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            raise RuntimeError(f"torch.distributed.checkpoint failed: {type(e).__name__}: {e}") from e

    def _finish(self, write: _Action, save_dir: Path, meta: bytes | None, rank: int, commit: _Action) -> None:
        """The writer thread: DCP's files, ``meta.pt``, this rank's part; rank 0 then commits."""
        try:
            write()
            if meta is not None:
                write_bytes_durably(save_dir / parts.LIGHTNING_META, meta)
            self._record_part(save_dir, rank)
        except BaseException as e:
            # Tell rank 0 at once instead of letting it wait for this rank's part until its timeout.
            with contextlib.suppress(OSError):
                parts.write_part(save_dir, rank, [], error=f"{type(e).__name__}: {e}")
            raise
        if rank == 0:
            commit()

    def _finish_in_memory(
        self,
        write: _Action,
        scratch: Path,
        meta: bytes | None,
        rank: int,
        fields: dict[str, Any],
        required: tuple[str, ...],
    ) -> None:
        """The writer thread, for a save into node memory: DCP's files, then the memory tier's commit."""
        assert self.memory is not None
        started = time.monotonic()
        failed = parts.attempt(write)
        size = self.memory.commit(self._group, scratch, rank, meta, fields, required, failed)
        if rank == 0:
            self.last_write = WriteStats(size, time.monotonic() - started)

    def _record_part(self, save_dir: Path, rank: int) -> None:
        """Fsync and hash the files this rank wrote (DCP's ``__<rank>_*`` shards) and record them."""
        parts.write_part(save_dir, rank, parts.hash_files(save_dir, parts.dcp_files_of(save_dir, rank)))

    def _commit(
        self, save_dir: Path, world: int, required: tuple[str, ...], fields: dict[str, Any], started: float
    ) -> None:
        """Global rank 0, once every rank recorded its files: commit, then tell the callback and mirror."""
        deadline = time.monotonic() + PART_TIMEOUT
        while not parts.parts_complete(save_dir, world):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Not every rank recorded its files in {str(save_dir)!r} within "
                    f"{PART_TIMEOUT} s: the save is not committed."
                )
            time.sleep(_POLL)
        manifest = parts.build_manifest(save_dir, world, required, saved_at=time.time(), **fields)
        final = parts.commit_directory(save_dir, self.pointer, manifest, self.keep)
        self.last_write = WriteStats(sum(f.size for f in manifest.files), time.monotonic() - started)
        log.debug("committed %s as %s (step %s)", final.name, self.pointer, manifest.global_step)
        self.on_commit()
        if self.mirror is not None:
            self.mirror.submit(DirectoryKind(self.pointer.name), final, lambda: manifest)

    def _agree(
        self, trainer: pl.Trainer, error: BaseException | None, target: Path | None, new: Path | None = None
    ) -> str | None:
        """One gather (a barrier): rank 0's ``new`` directory, or raise on every rank when any failed."""
        message = None if error is None else f"rank {trainer.global_rank}: {type(error).__name__}: {error}"
        chosen = None if new is None else str(new)
        gathered = gather_objects(trainer.strategy, (message, chosen))
        problems = [m for m, _ in gathered if m]
        if not problems:
            return gathered[0][1]
        if trainer.is_global_zero:
            for folder in filter(None, (target, new)):
                shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(
            f"Saving the sharded checkpoint into {str(target)!r} failed ({' | '.join(problems)}). "
            f"{self.pointer.name} still names the previous checkpoint."
        ) from error

    def wait(self, trainer: pl.Trainer) -> None:
        """Wait for the save in flight (every rank): raise if it failed on any rank, else it is committed."""
        if self._async_used:
            self._agree(trainer, *self._finish_pending())

    def _finish_pending(self) -> tuple[BaseException | None, Path | None]:
        """Wait for this rank's save in flight (if any); return what it raised and its directory."""
        pending, self._pending = self._pending, None
        save_dir, self._pending_dir = self._pending_dir, None
        return (parts.attempt(pending.result) if pending is not None else None), save_dir

    def wait_until_durable(self, trainer: pl.Trainer) -> None:
        """Wait until the newest save is committed (and uploaded, with ``wait_for_mirror``); every rank."""
        self.wait(trainer)
        if self.memory is not None:  # the newest save durable too, if only node memory holds it
            self.memory.to_durable(trainer, self._agree, self._commit)
        if self.mirror is not None and self.settings.mirror is not None and self.settings.mirror.wait:
            self.mirror.wait(self.settings.mirror.timeout)

    def close(self, trainer: pl.Trainer, collective: bool = True) -> None:
        """Finish the save in flight and stop; ``collective=False``: this rank only, warning on failure."""
        try:
            if collective:
                self.wait(trainer)
                if self.memory is not None:
                    self.memory.to_durable(trainer, self._agree, self._commit)
            elif self._pending is not None and (error := parts.attempt(self._pending.result)) is not None:
                warn(
                    f"The sharded checkpoint save in flight failed ({error}); "
                    f"{self.pointer.name} keeps the one before."
                )
        finally:
            self._pending = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self.mirror is not None and self.settings.mirror is not None and self.settings.mirror.wait:
                self.mirror.close(self.settings.mirror.timeout)


def _mirror(settings: CheckpointSettings, pointer: Path) -> Mirroring | None:
    """The mirror of sharded checkpoints in ``pointer.parent`` (global rank 0), if the settings have one."""
    if settings.mirror is None:
        return None
    if settings.dirpath is not None and settings.dirpath != pointer.parent:
        warn(
            f"Sharded checkpoints in {str(pointer.parent)!r} are not mirrored: DurableCheckpointIO("
            f"mirror={settings.mirror.url!r}) copies {str(settings.dirpath)!r}."
        )
        return None
    return settings.open_mirror(settings.directories_kept)


def _serialised(checkpoint: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()
