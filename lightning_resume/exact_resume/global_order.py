"""The global order of an epoch, and how much of it a checkpoint consumed, whatever the number of ranks.

A ``DistributedSampler`` orders the whole data set with one permutation, ``randperm(n)`` drawn from a
generator seeded with ``seed + epoch`` (``range(n)`` without shuffling), the same for every number of
ranks; it pads that order by repeating its head up to a multiple of the ranks ``W`` (or cuts its tail,
``drop_last``), and rank ``r`` takes every ``W``-th index from ``r`` on. After ``k`` batches of ``B``
samples per rank the ranks together have consumed exactly the first ``k * B * W`` indices of the
order. A checkpoint records that count (:class:`GlobalOrder`); a restart on ``M`` ranks splits the
rest of the same order over its ranks the same way (:func:`split`), so every sample of the
interrupted epoch is seen once in total, and later epochs are the ``M``-rank sampler's own.

One process without a ``DistributedSampler`` (Lightning's single-device ``RandomSampler``) draws its
permutation from the global random state as its sampler starts: that order is drawn again from the
random state every checkpoint records for it (:func:`sampler_order`).

Pure functions and one frozen record, no Lightning.
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

    Attributes:
        kind: Where the order comes from.
        length: Samples in the data set (``n``).
        shuffle: The order is a permutation (``False``: ``range(n)``).
        seed: The sampler's seed (``PERMUTATION``).
        drop_last: The sampler cuts the order to a multiple of the ranks instead of padding it.
        epoch: The epoch the count belongs to.
        consumed: Indices of the epoch's order the saved batches consumed, over all ranks.
        replicas: Ranks the order was split over when saved (the data-parallel size).
        batch_size: Samples per batch and rank when saved.
        resplit: The epoch's rest was split anew by a restart (not the sampler's own split): any
            later restart inside this epoch continues from ``consumed`` too.
        global_batch: Samples per optimizer step over all ranks (batch size x ranks x accumulation).
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
        try:
            kind = OrderKind(data["kind"])
            return cls(
                kind=kind,
                length=int(data["length"]),
                shuffle=bool(data["shuffle"]),
                seed=int(data["seed"]),
                drop_last=bool(data["drop_last"]),
                epoch=int(data["epoch"]),
                consumed=int(data["consumed"]),
                replicas=int(data["replicas"]),
                batch_size=int(data["batch_size"]),
                resplit=bool(data.get("resplit", False)),
                global_batch=int(data.get("global_batch", 0)),
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
    """The order a one-process ``RandomSampler`` drew for an epoch, from the random state it started
    from (the process's, and its own ``generator``'s, if any). The process's random state is left as
    it was."""
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
    """Rank ``rank``'s share of ``remaining``, split over ``replicas`` ranks as ``DistributedSampler``
    splits a whole epoch: padded by repeating the head to a multiple of the ranks (or cut, ``drop_last``),
    then every ``replicas``-th index from ``rank`` on."""
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
