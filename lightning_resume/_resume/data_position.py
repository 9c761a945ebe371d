"""Exact mid-epoch resume for plain ``DataLoader``s, without touching the user's data pipeline.

A plain loader's epoch is fixed by the random state at the moment its iterator is created: one
draw for the workers' base seed, one for ``RandomSampler``'s permutation (``DistributedSampler``
uses its seed and epoch instead). So a resume needs the epoch-start random state, the number of
batches already consumed, and a sampler that skips that many batches' worth of *indices*, never
loading them. Random augmentations inside worker processes depend on each worker's own stream,
which a resume cannot continue (the batches land on other workers); so, with workers, every batch
is drawn from generators seeded by the epoch's base seed, the rank and the batch's indices, in the
uninterrupted run and the resumed one alike.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, get_worker_info


def loader_problem(loader: Any) -> str | None:
    """Why ``loader`` cannot be positioned exactly mid-epoch (``None`` when it can)."""
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} is not a torch DataLoader"
    if hasattr(loader, "state_dict"):
        return None  # stateful loaders restore their own position
    if isinstance(loader.dataset, IterableDataset):
        return (
            f"{type(loader.dataset).__name__} is an IterableDataset without state: make it stateful "
            "(torchdata StatefulDataLoader + a dataset with state_dict/load_state_dict)"
        )
    batch_sampler = loader.batch_sampler
    if not (hasattr(batch_sampler, "sampler") and hasattr(batch_sampler, "batch_size")):
        return f"the batch sampler {type(batch_sampler).__name__} has no sampler/batch_size to skip through"
    if loader.persistent_workers:
        return "persistent_workers=True keeps worker state across epochs that a restart cannot rebuild"
    return None


def generators(loader: DataLoader) -> list[torch.Generator | None]:
    """The torch generators that decide a plain loader's order and worker seeds, in a fixed order."""
    sampler = getattr(loader.batch_sampler, "sampler", None)
    inner = sampler.sampler if isinstance(sampler, SkipFirst) else sampler
    return [loader.generator, getattr(inner, "generator", None)]


def capture_generators(loader: DataLoader) -> list[torch.Tensor | None]:
    return [g.get_state() if isinstance(g, torch.Generator) else None for g in generators(loader)]


def restore_generators(loader: DataLoader, states: list[torch.Tensor | None]) -> None:
    for generator, state in zip(generators(loader), states, strict=True):
        if isinstance(generator, torch.Generator) and state is not None:
            generator.set_state(state)


class SkipFirst(Sampler[Any]):
    """Wrap a sampler so that its next epoch starts ``skip`` indices in, drawn but never loaded.

    The skip happens when the epoch's index stream starts: inside the loader's iterator with
    workers (which start at once), or at :meth:`start` without them, so the sampler's random draw
    comes right after the iterator's own, as in an uninterrupted epoch. Later epochs pass through.
    """

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler = sampler
        self.skip = skip
        self._pending: Iterator[Any] | None = None

    def _skipped(self) -> Iterator[Any]:
        iterator = iter(self.sampler)
        next(itertools.islice(iterator, self.skip, self.skip), None)
        self.skip = 0
        return iterator

    def start(self) -> None:
        """Start the pending epoch now (no-op when the loader's iterator already did)."""
        if self.skip:
            self._pending = self._skipped()

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        return self._skipped() if self.skip else iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def skip_batches(loader: DataLoader, batches: int, epoch: int) -> SkipFirst:
    """Make ``loader``'s next epoch (number ``epoch``) start after ``batches`` batches; return the wrapper."""
    batch_sampler: Any = loader.batch_sampler
    inner = batch_sampler.sampler
    wrapper = inner if isinstance(inner, SkipFirst) else SkipFirst(inner, 0)
    wrapper.skip = batches * int(batch_sampler.batch_size)
    wrapper.set_epoch(epoch)
    batch_sampler.sampler = wrapper
    return wrapper


def batch_seed(base: int, rank: int, indices: Any) -> int:
    """A seed for one batch from the epoch's base seed, the rank and the batch's sample indices."""
    digest = zlib.crc32(np.asarray(list(indices), dtype=np.int64).tobytes())
    return (base * 1_000_003 + rank * 7_919 + digest) % (2**63)


class _SeededFetch:
    """``dataset.__getitems__`` inside a worker: seed every generator per batch, then fetch."""

    def __init__(self, dataset: Any, base: int, rank: int) -> None:
        self.dataset = dataset
        self.base = base
        self.rank = rank
        self.inner = getattr(type(dataset), "__getitems__", None)

    def __call__(self, indices: list[Any]) -> Any:
        seed = batch_seed(self.base, self.rank, indices)
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        if self.inner is not None:
            return self.inner(self.dataset, indices)
        return [self.dataset[i] for i in indices]


class SeedWorkersPerBatch:
    """A ``worker_init_fn`` that runs the user's, then seeds each batch from its own indices.

    Only the worker's copy of the dataset is changed; the user's object in the main process is not.
    """

    def __init__(self, user_fn: Any, rank: int) -> None:
        self.user_fn = user_fn
        self.rank = rank

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        info = get_worker_info()
        if info is None:
            return
        info.dataset.__getitems__ = _SeededFetch(info.dataset, info.seed - info.id, self.rank)  # type: ignore[attr-defined]


def seed_workers_per_batch(loader: DataLoader, rank: int) -> bool:
    """Install :class:`SeedWorkersPerBatch` on a loader with workers; return whether it changed."""
    if loader.num_workers == 0 or isinstance(loader.worker_init_fn, SeedWorkersPerBatch):
        return False
    loader.worker_init_fn = SeedWorkersPerBatch(loader.worker_init_fn, rank)
    return True
