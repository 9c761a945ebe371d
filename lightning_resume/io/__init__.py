"""Checkpoint IO: the ``DurableCheckpointIO`` plugin and what it is made of.

Verified loads, retention, the remote mirror, the shared-memory snapshot and the asynchronous saver
live here; the writer process they hand files to is in ``lightning_resume._writer``.
"""

from lightning_resume.io._protocol import AtomicCheckpointIO
from lightning_resume.io.durable_checkpoint_io import DurableCheckpointIO

__all__ = ["AtomicCheckpointIO", "DurableCheckpointIO"]
