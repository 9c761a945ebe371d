"""Checkpoint IO: the ``DurableCheckpointIO`` plugin (``durable_checkpoint_io``), what callbacks may ask
of any plugin (``_protocol``), the snapshot and the asynchronous saver (``_snapshot``, ``_async_saver``,
``_parallel_copy``) and the verified load (``_verified_load``)."""

from lightning_resume.io._protocol import AtomicCheckpointIO, CheckpointSettings
from lightning_resume.io.durable_checkpoint_io import DurableCheckpointIO

__all__ = ["AtomicCheckpointIO", "CheckpointSettings", "DurableCheckpointIO"]
