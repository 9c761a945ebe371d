"""``last.ckpt``: ``RequeueCheckpoint`` and its parts, one module each (docs/src/architecture.md)."""
