"""The memory tier: ``last.ckpt`` in node memory, copied to peer nodes; the durable tier less often."""
