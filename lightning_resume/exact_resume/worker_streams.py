"""The random streams of data-loader workers, continued across a mid-epoch resume.

In an epoch's iterator, batch ``j`` goes to worker ``j % n``, and each worker's generators (torch,
numpy, Python) are seeded from the epoch's base seed and the worker's id, then advanced by every
batch it loads. A resumed epoch starts at batch ``k`` on worker 0; :class:`ResumedWorkers` (the
resumed iterator's ``worker_init_fn``) makes worker ``i`` play worker ``(i + k) % n``: it is seeded
as that worker was, runs the user's ``worker_init_fn`` with that id, then loads (and drops) that
worker's earlier batches of the epoch, inside the worker process, so its streams are where they were.
Only the resumed epoch's iterator gets it: a run draws exactly what it draws without us.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import get_worker_info

from lightning_resume._compat.torch import seed_as_worker


def fetch(dataset: Any, indices: list[Any], collate_fn: Callable[[list[Any]], Any]) -> Any:
    """Load one batch as a worker does (``_MapDatasetFetcher.fetch`` with automatic batching)."""
    if getattr(dataset, "__getitems__", None):
        return collate_fn(dataset.__getitems__(indices))
    return collate_fn([dataset[i] for i in indices])


class ResumedWorkers:
    """A ``worker_init_fn`` for a resumed epoch ``shift`` batches in, whose skipped batches are ``skipped``.

    Args:
        user_fn: The loader's own ``worker_init_fn`` (Lightning's, with ``seed_everything(workers=True)``).
        skipped: The indices of the epoch's batches before the resumed one, in order.
        collate_fn: The loader's ``collate_fn``.
    """

    def __init__(
        self, user_fn: Callable[[int], None] | None, skipped: list[list[Any]], collate_fn: Callable[..., Any]
    ) -> None:
        self.user_fn = user_fn
        self.skipped = skipped
        self.collate_fn = collate_fn

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None, "ResumedWorkers runs in data-loader workers only"
        role = (worker_id + len(self.skipped)) % info.num_workers
        seed_as_worker(info.seed - info.id, role)
        if self.user_fn is not None:
            self.user_fn(role)
        for indices in self.skipped[role :: info.num_workers]:
            fetch(info.dataset, indices, self.collate_fn)
