"""What the callbacks may ask of a ``CheckpointIO`` plugin: protocols ``DurableCheckpointIO`` implements."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_resume._writer.duty_cycle import WriteStats
from lightning_resume.io.restore import Restore


@runtime_checkable
class AtomicCheckpointIO(Protocol):
    """A checkpoint plugin that writes every file atomically and can wait for its writes in flight.

    ``RequeueCheckpoint`` lets such a plugin write ``last.ckpt`` itself, and waits on
    :meth:`wait_until_durable` when a preemption needs it on disk. ``DurableCheckpointIO`` is one."""

    #: ``True``: a kill at any instant leaves the previous file or the new one at the target path.
    writes_atomically: bool

    def wait_until_durable(self) -> None:
        """Block until every write in flight is on disk; raise its error if it failed."""


@runtime_checkable
class ReportsWrites(Protocol):
    """Writes checkpoints and says how each became durable: a new :attr:`last_write` at every commit."""

    @property
    def last_write(self) -> WriteStats | None:
        """How the newest committed save was written, or ``None`` before the first one."""


@runtime_checkable
class HurryingCheckpointIO(ReportsWrites, Protocol):
    """A checkpoint plugin that can make its next save durable sooner (before a preemption's last save)."""

    def _hurry(self) -> None:
        """Switch writes in flight to full speed and write the next save as soon as possible."""


@runtime_checkable
class TieredCheckpointIO(Protocol):
    """A checkpoint plugin with a memory tier across nodes: ``RequeueCheckpoint`` introduces the nodes
    (every rank, in ``setup``) and lets the copies finish before the ranks part."""

    def _attach_memory(self, strategy: Any, durable_dir: Path) -> None:
        """Learn the nodes and what their memory tiers hold (a collective)."""

    def _settle_memory(self) -> None:
        """Wait for this process's copies to other nodes and to the durable tier."""

    def _close_memory(self) -> None:
        """Stop serving this node's memory tier (after every rank settled)."""

    def _restored(self, record: Restore) -> None:
        """A restore done outside the plugin (a sharded save assembled from the memory tier): record it."""
