"""The random streams of data-loader workers, continued across a mid-epoch resume: batch ``j`` goes to worker
``j % n``, so a resumed epoch starting at batch ``k`` makes worker ``i`` play worker ``(i + k) % n``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info

from lightning_resume._compat.torch import seed_as_worker


@dataclass(eq=False)
class ResumedWorkers:
    """A resumed iterator's ``worker_init_fn``: each worker plays another, its earlier batches ``skipped``."""

    user_fn: Callable[[int], None] | None
    skipped: list[list[Any]]
    collate_fn: Callable[..., Any]

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None, "ResumedWorkers runs in data-loader workers only"
        role = (worker_id + len(self.skipped)) % info.num_workers
        seed_as_worker(info.seed - info.id, role)
        if self.user_fn is not None:
            self.user_fn(role)
        dataset: Any = info.dataset
        for indices in self.skipped[role :: info.num_workers]:  # loaded as _MapDatasetFetcher.fetch does
            if getattr(dataset, "__getitems__", None):
                self.collate_fn(dataset.__getitems__(indices))
            else:
                self.collate_fn([dataset[i] for i in indices])
