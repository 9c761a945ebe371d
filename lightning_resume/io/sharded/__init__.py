"""Sharded checkpoints: directories saved by every rank, committed atomically, verified on restart
(Lightning calls no ``CheckpointIO`` for them: ``RequeueCheckpoint`` hands them here)."""
