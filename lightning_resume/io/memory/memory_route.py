"""``MemoryRoute``: the memory tier's route for ``DurableCheckpointIO`` saves (where the commit lands, and
the copies after it), around the plugin's own route; and the tier's lifecycle."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_resume._storage.manifest import Entry
from lightning_resume.io.memory.node_memory import NodeMemory
from lightning_resume.io.restore import Restore
from lightning_resume.io.routes import Known, OnCommit, Route
from lightning_resume.io.sharded.in_memory import ShardedMemory, restore
from lightning_resume.io.write_stats import WriteStats

log = logging.getLogger(__name__)


class MemoryRoute:
    """The route of a plugin with a memory tier around its own route ``inner``, and the tier's lifecycle
    (``MemoryTierLifecycle``). ``wrote``: each save into memory; ``restored``: a sharded save's restore."""

    def __init__(
        self,
        memory: NodeMemory,
        inner: Route,
        wrote: Callable[[WriteStats], None],
        restored: Callable[[Restore], None],
    ) -> None:
        self.memory, self.inner = memory, inner
        self._wrote, self._restored = wrote, restored
        self._in_memory = False  # the save in flight goes into memory
        self._on_durable: OnCommit | None = None  # of the newest save into memory

    # -- the route ---------------------------------------------------------------------------------

    def save(
        self,
        checkpoint: dict[str, Any],
        target: Path,
        fields: dict[str, Any],
        known: Known,
        on_commit: OnCommit,
        full_speed: bool = False,
    ) -> None:
        """``last.ckpt`` into node memory at full speed when the tier takes it; else as without the tier."""
        try:
            self.inner.wait()  # the save in flight commits first: its commit starts its copies
        except OSError as e:
            if e.errno != errno.ENOSPC or not self._in_memory:
                raise
            self.memory.full(e.strerror or str(e))  # the save into memory was lost: this one goes durable
        self._in_memory = False
        where = self.memory.target(target, checkpoint)
        if where is None:
            self.inner.save(checkpoint, target, fields, known, on_commit, full_speed)
            return
        memory, due = where
        self._in_memory, self._on_durable = True, on_commit

        def committed(path: Path, entry: Entry, stats: WriteStats | None, pruned: list[str]) -> None:
            if stats is not None:
                self._wrote(stats)
            self.memory.committed(path, entry, target, due, self._durable)

        self.inner.save(checkpoint, memory, fields, lambda: None, committed, full_speed=True)

    def _durable(self, path: Path, entry: Entry, pruned: list[str]) -> None:
        if self._on_durable is not None:
            self._on_durable(path, entry, None, pruned)

    def wait(self) -> None:
        self.inner.wait()

    def hurry(self) -> None:
        self.inner.hurry()

    @property
    def busy(self) -> bool:
        return self.inner.busy

    def finish(self) -> None:
        """The plugin's teardown: the save in flight, then the newest save durable (the server stays up)."""
        try:
            self.inner.finish()
        finally:
            if self.memory.attached:
                self.memory.finish(self._durable)

    def wait_until_durable(self) -> None:
        """The save in flight committed and the newest save in memory durable (replicas go on meanwhile)."""
        self.inner.wait()
        if self.memory.attached:
            self.memory.finish(self._durable, replicas=False)

    def urgent(self) -> None:
        """A save goes straight to the durable tier (the urgent path): drop the queued durable copies."""
        self.memory.cancel_durable()

    # -- the lifecycle (RequeueCheckpoint, every rank) ---------------------------------------------

    def attach(self, strategy: Any, durable_dir: Path) -> None:
        """Introduce the nodes' memory tiers and learn what they hold (in ``setup``)."""
        self.memory.attach(strategy, durable_dir)

    def settle(self) -> None:
        """Wait for this process's copies to other nodes and to the durable tier (training ended)."""
        if self.memory.attached:
            self.inner.wait()
            self.memory.finish(self._durable)

    def close(self) -> None:
        """Stop this node's memory tier server (every rank done copying)."""
        self.memory.close()

    def restore_sharded(self, trainer: Any, pointer: Path) -> tuple[int, Path] | None:
        """``MemoryTierLifecycle.restore_sharded``, reported as the plugin's ``last_restore``."""
        restored = restore(self.memory, trainer, pointer)
        if restored is None:
            return None
        shard_set, directory, record = restored
        self._restored(record)
        return shard_set.world_size, directory

    def sharded(self, pointer: Path) -> ShardedMemory | None:
        """The tier's part in the sharded saves of ``pointer`` (``None`` when it is not attached)."""
        return ShardedMemory(self.memory, pointer) if self.memory.attached else None
