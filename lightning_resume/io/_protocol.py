"""What the callbacks and the sharded saver may ask of a ``CheckpointIO`` plugin: small protocols that
:class:`~lightning_resume.DurableCheckpointIO` implements and any plugin may."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from lightning_resume._writer.duty_cycle import WriteStats


@runtime_checkable
class AtomicCheckpointIO(Protocol):
    """A checkpoint plugin that writes every file atomically and can wait for its writes in flight.

    ``RequeueCheckpoint`` lets such a plugin write ``last.ckpt`` itself (instead of writing a
    temporary file and renaming it), and waits on :meth:`wait_until_durable` when a preemption needs
    ``last.ckpt`` on disk. :class:`~lightning_resume.DurableCheckpointIO` is one.
    """

    #: ``True``: a kill at any instant leaves the previous file or the new one at the target path.
    writes_atomically: bool

    def wait_until_durable(self) -> None:
        """Block until every write in flight is on disk; raise its error if it failed."""
        ...


@runtime_checkable
class ReportsWrites(Protocol):
    """Something that writes checkpoints and says when each one became durable: a new
    :attr:`last_write` object appears as a save is committed (the plugin's own, or the sharded saver's).
    ``RequeueCheckpoint`` times a save's time to durable from it."""

    @property
    def last_write(self) -> WriteStats | None:
        """How the newest committed save was written, or ``None`` before the first one."""
        ...


@runtime_checkable
class HurryingCheckpointIO(ReportsWrites, Protocol):
    """A checkpoint plugin that can make its next save durable sooner, and says how each write went.

    ``PreemptionHandler`` calls :meth:`_hurry` before its last save (a wait for it follows at once) and
    reports :attr:`last_write` in its stop line. :class:`~lightning_resume.DurableCheckpointIO` is one.
    """

    def _hurry(self) -> None:
        """Switch writes in flight to full speed and write the next save as soon as possible."""
        ...
