"""What a restore read: a record for logs, ``attempts.json`` and ``lightning-resume report``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MEMORY = "memory"  #: a node's memory tier (``MemoryTier``)
DURABLE = "durable"  #: the checkpoint directory, or its mirror


@dataclass(frozen=True)
class Restore:
    """One checkpoint load by ``DurableCheckpointIO``: from which tier and node, how much, how long."""

    tier: str  # MEMORY or DURABLE
    path: str  # the checkpoint Lightning asked for
    bytes: int
    seconds: float  # from the call to the loaded state (fetch, verify, deserialise)
    node: int | None = None  # memory: the node rank whose memory held the copy
    host: str | None = None  # memory: that node's host name
    step: int | None = None  # the global step the checkpoint was saved at
    started: float = 0.0  # wall clock (time.time()) when the load began

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The one log line: which tier, from which node, how many bytes, how long."""
        where = "the durable tier"
        if self.tier == MEMORY:
            where = f"the memory tier of node {self.node} ({self.host})"
        step = "" if self.step is None else f" (step {self.step})"
        return (
            f"restored {self.path}{step} from {where}: {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s "
            f"({self.bytes / 1e6 / max(self.seconds, 1e-9):.0f} MB/s)"
        )
