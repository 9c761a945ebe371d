"""The global order of an epoch, and how much of it a checkpoint consumed, whatever the number of ranks.

A ``DistributedSampler`` orders the whole data set with one permutation (``randperm(n)`` seeded with
``seed + epoch``, or ``range(n)``) whatever the ranks ``W``, pads or cuts it to a multiple of ``W``, and
rank ``r`` takes every ``W``-th index from ``r``: after ``k`` batches of ``B`` the ranks consumed exactly
its first ``k * B * W`` indices. A restart on other ranks splits the rest alike (:func:`split`), so every
sample of the interrupted epoch is seen once. One process's ``RandomSampler`` order is drawn again from
the recorded random state (:func:`sampler_order`). Pure functions, no Lightning.
"""

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
    """How far a checkpoint's epoch went through its global order (saved as plain values).

    ``consumed``: the order's indices the saved batches consumed over all ranks; ``replicas`` and
    ``batch_size``: the split when saved; ``resplit``: a restart split the epoch's rest anew, so later
    restarts inside it continue from ``consumed`` too; ``global_batch``: samples per optimizer step.
    """

    kind: OrderKind
    length: int
    shuffle: bool
    seed: int
    drop_last: bool
    epoch: int
    consumed: int
    replicas: int
    batch_size: int
    resplit: bool = False
    global_batch: int = 0

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
    """The order a one-process ``RandomSampler`` drew for an epoch from the states it started from (the
    process's, and its own ``generator``'s); the process's own is left as it was."""
    before = rng.capture()
    try:
        rng.restore(start_rng)
        return list(RandomSampler(range(length), generator=_generator(generator)))
    finally:
        rng.restore(before)


def _generator(state: torch.Tensor | None) -> torch.Generator | None:
    if state is None:
        return None
    generator = torch.Generator()
    generator.set_state(state)
    return generator


def split(remaining: list[int], replicas: int, rank: int, drop_last: bool) -> list[int]:
    """Rank ``rank``'s share of ``remaining`` over ``replicas`` ranks, split as ``DistributedSampler``
    splits an epoch (padded with its head or cut, ``drop_last``; every ``replicas``-th from ``rank``)."""
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


def batches(samples: int, batch_size: int, drop_last: bool) -> int:
    """How many batches a ``BatchSampler`` makes of ``samples`` indices."""
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)
