"""Internal: the ``DurableCheckpointIO`` plugin, its settings, the memory tier, the checkpoint directories
of sharded strategies. No user API: the public names (``DurableCheckpointIO``, ``Mirror``, ``MemoryTier``,
``CheckpointSettings``, ``Restore``, ``WriteStats``) are imported from ``lightning_resume``."""
