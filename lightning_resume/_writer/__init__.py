"""The writer process of asynchronous saves (no torch, no Lightning: it starts in tens of milliseconds)."""
