"""An epoch's global order, the same on any ``W`` ranks (rank ``r`` takes every ``W``-th index from ``r``),
and how much of it a checkpoint consumed: ``k`` batches of ``B`` on ``W`` ranks, the first ``k * B * W``."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.data import RandomSampler

from lightning_resume.exact_resume import rng


class OrderKind(str, enum.Enum):
    """Where an epoch's global order comes from."""

    #: ``randperm(n)`` seeded with ``seed + epoch`` (``range(n)`` unshuffled): a ``DistributedSampler``'s,
    #: or a one-process ``SequentialSampler``'s.
    PERMUTATION = "permutation"
    #: One process's ``RandomSampler``: drawn from the global random state at the epoch's start.
    REPLAYED = "replayed"


@dataclass(frozen=True)
class GlobalOrder:
    """How far a checkpoint's epoch went through its global order (saved as plain values)."""

    kind: OrderKind
    length: int
    shuffle: bool
    seed: int
    drop_last: bool
    epoch: int
    consumed: int  # the order's indices the saved batches consumed over all ranks
    replicas: int  # the split when saved: ranks and per-rank batch size
    batch_size: int
    resplit: bool = False  # a restart split the epoch's rest anew: later restarts go on from ``consumed``
    global_batch: int = 0  # samples per optimizer step

    def to_dict(self) -> dict[str, Any]:
        """Plain values (Lightning loads checkpoints with ``weights_only=True``)."""
        return {**asdict(self), "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: Any) -> GlobalOrder | None:
        """What :meth:`to_dict` returned (``None`` for a checkpoint without one, or an unknown kind)."""
        if not isinstance(data, dict):
            return None
        ints = ("length", "seed", "epoch", "consumed", "replicas", "batch_size")
        try:
            return cls(
                kind=OrderKind(data["kind"]),
                shuffle=bool(data["shuffle"]),
                drop_last=bool(data["drop_last"]),
                resplit=bool(data.get("resplit", False)),
                global_batch=int(data.get("global_batch", 0)),
                **{k: int(data[k]) for k in ints},
            )
        except (KeyError, TypeError, ValueError):
            return None


def permutation(length: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """A ``DistributedSampler``'s order of one epoch before it is padded and split (any number of ranks)."""
    if not shuffle:
        return list(range(length))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(length, generator=generator).tolist()


def sampler_order(length: int, start_rng: dict[str, Any], generator: torch.Tensor | None) -> list[int]:
    """A one-process ``RandomSampler``'s order drawn again from the global and its own ``generator`` state."""
    own = None
    if generator is not None:
        own = torch.Generator()
        own.set_state(generator)
    with rng.scoped(start_rng):
        return list(RandomSampler(range(length), generator=own))


def split(remaining: list[int], replicas: int, rank: int, drop_last: bool) -> list[int]:
    """Rank ``rank``'s share of ``remaining`` over ``replicas`` ranks, as ``DistributedSampler`` splits it."""
    if not remaining:
        return []
    if drop_last:
        total = len(remaining) // replicas * replicas
        order = remaining[:total]
    else:
        total = math.ceil(len(remaining) / replicas) * replicas
        repeats = math.ceil(total / len(remaining))
        order = (remaining * repeats)[:total]
    return order[rank:total:replicas]
