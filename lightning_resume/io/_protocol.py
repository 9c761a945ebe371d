"""What ``RequeueCheckpoint`` and ``PreemptionHandler`` need to know about a ``CheckpointIO`` plugin."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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
