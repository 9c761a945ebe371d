"""``RemainingOrder``: a ``DistributedSampler`` that yields this rank's share of the rest of an interrupted
epoch's global order after a restart on another number of ranks (see :mod:`.global_order`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler


class RemainingOrder(Sampler[int]):
    """``indices`` while ``sampler`` is at ``epoch``, else its own order; its length stays the sampler's."""

    def __init__(self, sampler: Any, epoch: int, indices: list[int]) -> None:
        self.sampler = sampler
        self.epoch = epoch
        self.indices = indices
        sampler.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.sampler.epoch == self.epoch:
            return iter(list(self.indices))
        return iter(self.sampler)

    def __len__(self) -> int:  # Lightning counts the epoch's batches from its start
        return len(self.sampler)
