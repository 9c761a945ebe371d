"""What the callbacks may ask of a ``CheckpointIO`` plugin: protocols ``DurableCheckpointIO`` implements."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_resume.io.write_stats import WriteStats


@runtime_checkable
class AtomicCheckpointIO(Protocol):
    """A plugin that writes atomically and waits for its writes: ``RequeueCheckpoint`` lets it save itself."""

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


class MemoryTierLifecycle(Protocol):
    """A plugin's memory tier as ``RequeueCheckpoint`` drives it, every rank at the same point
    (``DurableCheckpointIO``'s is ``memory_tier_of(plugin)``)."""

    def attach(self, strategy: Any, durable_dir: Path) -> None:
        """Learn the nodes and what their memory tiers hold."""

    def restore_sharded(self, trainer: Any, pointer: Path) -> tuple[int, Path] | None:
        """The newest sharded save the nodes hold, assembled: its world size and directory, or ``None``."""

    def settle(self) -> None:
        """Wait for this process's copies to other nodes and to the durable tier."""

    def close(self) -> None:
        """Stop serving this node's memory tier (after every rank settled)."""


def hurry(io: object) -> None:
    """Before a preemption's last save: the write in flight at full speed, the next written at once."""
    if isinstance(io, HurryingCheckpointIO):
        io._hurry()
