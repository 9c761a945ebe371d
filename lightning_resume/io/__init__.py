"""Internal: the ``DurableCheckpointIO`` plugin, its settings, the memory tier, sharded checkpoints. No user
API: the public names are imported from ``lightning_resume``."""
