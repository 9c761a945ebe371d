"""``RemainingOrder``: a ``DistributedSampler`` whose interrupted epoch yields this rank's share of the rest.

After a restart on another number of ranks (see :mod:`.global_order`), the epoch the checkpoint
interrupted goes on with what is left of its global order, split over the new ranks; every later
epoch is the wrapped sampler's own, which ``set_epoch`` selects as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler


class RemainingOrder(Sampler[int]):
    """Yield ``indices`` while ``sampler`` is at ``epoch``; otherwise ``sampler``'s own order.

    Its length stays the wrapped sampler's: Lightning counts the resumed epoch's batches from the
    epoch's start (the batches already done plus those of ``indices``), as for a whole epoch.

    Args:
        sampler: The sampler that decides every other epoch (it has ``epoch`` and ``set_epoch``).
        epoch: The epoch to continue.
        indices: This rank's share of the rest of that epoch's global order.
    """

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

    def __len__(self) -> int:
        return len(self.sampler)
