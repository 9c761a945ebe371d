"""The random streams of data-loader workers, continued across a mid-epoch resume.

Batch ``j`` goes to worker ``j % n``, seeded from the epoch's base seed and its id, then advanced by each
batch it loads. A resumed epoch starts at batch ``k`` on worker 0: :class:`ResumedWorkers` (the resumed
iterator's only) makes worker ``i`` play worker ``(i + k) % n``: seeded as it, the user's
``worker_init_fn`` run with its id, its earlier batches loaded and dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info

from lightning_resume._compat.torch import seed_as_worker


def fetch(dataset: Any, indices: list[Any], collate_fn: Callable[[list[Any]], Any]) -> Any:
    """Load one batch as a worker does (``_MapDatasetFetcher.fetch`` with automatic batching)."""
    if getattr(dataset, "__getitems__", None):
        return collate_fn(dataset.__getitems__(indices))
    return collate_fn([dataset[i] for i in indices])


@dataclass(eq=False)
class ResumedWorkers:
    """A resumed epoch's ``worker_init_fn``: ``skipped``, the indices of its batches before the resumed
    one; ``user_fn`` and ``collate_fn``, the loader's own."""

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
        for indices in self.skipped[role :: info.num_workers]:
            fetch(info.dataset, indices, self.collate_fn)
