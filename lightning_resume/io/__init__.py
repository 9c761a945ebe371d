"""Checkpoint IO: the ``DurableCheckpointIO`` plugin and its own parts.

The plugin (``durable_checkpoint_io``), what callbacks may ask of any plugin (``_protocol``: the
settings and the protocols), the shared-memory snapshot and the asynchronous saver that hands it to
the writer process (``_snapshot``, ``_async_saver``), and the verified load (``_verified_load``).
Storage (commit, verify, retention, the mirror) is ``lightning_resume._storage``; the writer process
is ``lightning_resume._writer``; sharded checkpoints are ``lightning_resume._sharded``.
"""

from lightning_resume.io._protocol import AtomicCheckpointIO, CheckpointSettings
from lightning_resume.io.durable_checkpoint_io import DurableCheckpointIO

__all__ = ["AtomicCheckpointIO", "CheckpointSettings", "DurableCheckpointIO"]
