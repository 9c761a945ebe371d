"""``MemoryTier``: where and how often ``DurableCheckpointIO`` keeps ``last.ckpt`` in node memory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lightning_resume._checks import expand_dir, positive_number, whole_number

DEFAULT_PATH = "/dev/shm/lightning_resume"
#: The checkpoint file the memory tier holds: the one a restart resumes from.
HELD_NAME = "last.ckpt"


@dataclass(frozen=True)
class MemoryTier:
    """``last.ckpt`` in node memory, copied to other nodes' memory, written to the durable tier less often.

    Passed as ``DurableCheckpointIO(memory=MemoryTier(...))``, with ``RequeueCheckpoint`` among the
    callbacks (its ``setup`` introduces the nodes to each other). Each save of ``last.ckpt`` is
    committed atomically and verified in ``path`` (a tmpfs: memory), then copied in the background to
    the memory of ``replicas`` other nodes. The durable tier (the checkpoint directory, and its mirror)
    gets the first save, every ``durable_every``-th, the save at a preemption signal or notice, and the
    newest one when training ends. A restart loads the newest committed copy any node still holds,
    fetched from that node and verified, or the durable ``last.ckpt`` when it is as new; never an
    older checkpoint than the durable one. A node whose ``path`` is full writes to the durable tier
    instead, with one warning.

    Memory used per node: the node's own copy and one per node it is a replica for, each the size of
    ``last.ckpt`` (briefly one more while a new copy commits).

    Sharded checkpoints (``ModelParallelStrategy``, saved asynchronously through
    ``torch.distributed.checkpoint``): every rank's shard is committed in its own node's memory and sent
    to its node's peers; a restart assembles the newest save whose every shard some node holds.

    Args:
        path: A directory in node memory (variables expanded). Each run gets a folder of its own in it.
        replicas: How many other nodes hold a copy (``0``: only the writing node; restores after a
            process restart, not after a node loss). More than the job's nodes minus one: all of them.
        durable_every: Write every ``durable_every``-th save of ``last.ckpt`` to the durable tier too.
        port: The TCP port each node serves its copies on (``0``: any free port).
        timeout: Seconds a copy to or from another node may stall before it is given up.

    Raises:
        TypeError, ValueError: for an invalid setting.

    Example::

        trainer = Trainer(
            num_nodes=4,
            plugins=[DurableCheckpointIO(memory=MemoryTier(replicas=1, durable_every=20))],
            callbacks=[RunDir(), RequeueCheckpoint(every_n_train_steps=50)],
        )
    """

    path: str | Path = DEFAULT_PATH
    replicas: int = 1
    durable_every: int = 10
    port: int = 0
    timeout: float = 120.0

    def __post_init__(self) -> None:
        whole_number("MemoryTier replicas", self.replicas, minimum=0, what="whole number of nodes")
        whole_number("MemoryTier durable_every", self.durable_every, minimum=1, what="whole number of saves")
        whole_number("MemoryTier port", self.port, minimum=0, what="TCP port number")
        if self.port > 65535:
            raise ValueError(f"MemoryTier port must be a TCP port (0-65535), got {self.port!r}.")
        timeout = positive_number("MemoryTier timeout", self.timeout, what="number of seconds")
        object.__setattr__(self, "path", expand_dir(self.path, "MemoryTier(path=...)"))
        object.__setattr__(self, "timeout", timeout)

    def usable(self) -> str | None:
        """Why ``path`` cannot hold checkpoints here, or ``None`` when it can."""
        try:
            Path(self.path).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"cannot create {str(self.path)!r} ({e.strerror or e})"
        if not os.access(self.path, os.W_OK):
            return f"{str(self.path)!r} is not writable"
        return None
