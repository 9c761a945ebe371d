"""Exact mid-epoch resume for plain ``DataLoader``s, without changing what an uninterrupted run draws.

A plain loader's epoch comes from two draws: the workers' base seed, as its iterator is made, and
``RandomSampler``'s permutation, as the sampler starts (``DistributedSampler`` uses its seed and epoch).
:func:`watch` records the random state at both moments and changes nothing else; :func:`replay` makes
the interrupted epoch's iterator again from them, the sampler skipping the consumed batches' *indices*
without loading them; :mod:`.worker_streams` continues the workers' random streams.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, TypedDict

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from lightning_resume._compat.torch import (
    iterator_factory,
    replace_iterator_factory,
    replaced_iterator_factory,
)
from lightning_resume.exact_resume import rng


class EpochDraws(TypedDict):
    """The random state as a loader's current epoch drew: at its iterator, and as its sampler started."""

    iterator: dict[str, Any] | None
    sampler: dict[str, Any] | None


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


def _state(generator: torch.Generator | None) -> torch.Tensor | None:
    return generator.get_state() if isinstance(generator, torch.Generator) else None


def _set(generator: torch.Generator | None, state: torch.Tensor | None) -> None:
    if isinstance(generator, torch.Generator) and state is not None:
        generator.set_state(state)


def _capture(generator: torch.Generator | None) -> dict[str, Any]:
    """The global random state and ``generator``'s (a loader's or a sampler's own ``generator=``)."""
    return {"rng": rng.capture(), "generator": _state(generator)}


class EpochSampler(Sampler[Any]):
    """Wraps a loader's sampler: records the random state each epoch's order is drawn from; after
    :meth:`resume`, the next epoch is a recorded one again."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.start: dict[str, Any] | None = None  # the state the current epoch's order came from
        self._pending: Iterator[Any] | None = None

    def resume(self, start: dict[str, Any], skip: int) -> list[Any]:
        """Draw the epoch that started from ``start`` again (in :func:`rng.scoped`; the sampler's own
        generator ends where the interrupted run's did) and skip ``skip`` indices; return those."""
        _set(getattr(self.sampler, "generator", None), start["generator"])
        with rng.scoped(start["rng"]):
            iterator = iter(self.sampler)
            skipped = list(itertools.islice(iterator, skip))  # a lazy sampler draws at its first index
        self.start, self._pending = start, iterator
        return skipped

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        self.start = _capture(getattr(self.sampler, "generator", None))
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class RecordIterator:
    """Makes a loader's iterators in its place (``_compat.torch.replace_iterator_factory``): records the
    random state each iterator is made from, or makes it from a given one (:meth:`replay_next`)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.original = iterator_factory(loader)
        self.start: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None

    def replay_next(self, start: dict[str, Any]) -> None:
        """Make the next iterator from ``start`` (the workers' base seed is drawn from it)."""
        self._pending = start

    def __call__(self) -> Any:
        pending, self._pending = self._pending, None
        if pending is None:
            self.start = _capture(self.loader.generator)
            return self.original()
        # The loader's own generator (shared with its sampler) keeps the state the replayed sampler
        # left it in: in the interrupted run the sampler drew after the base seed.
        after = _state(self.loader.generator)
        _set(self.loader.generator, pending["generator"])
        with rng.scoped(pending["rng"]):
            iterator = self.original()
        _set(self.loader.generator, after)
        self.start = pending
        return iterator


def watch(loader: Any) -> bool:
    """Record the draws of ``loader``'s epochs from now on (a plain loader that can be positioned)."""
    if loader_problem(loader) is not None or hasattr(loader, "state_dict") or _watched(loader):
        return False
    replace_iterator_factory(loader, RecordIterator(loader))
    batch_sampler: Any = loader.batch_sampler
    batch_sampler.sampler = EpochSampler(batch_sampler.sampler)
    return True


def _watched(loader: DataLoader) -> bool:
    return isinstance(replaced_iterator_factory(loader), RecordIterator)


def draws(loader: DataLoader) -> EpochDraws | None:
    """The random states ``loader``'s current epoch was drawn from (``None``: not watched)."""
    if not _watched(loader):
        return None
    sampler = getattr(loader.batch_sampler, "sampler", None)
    return {
        "iterator": replaced_iterator_factory(loader).start,
        "sampler": sampler.start if isinstance(sampler, EpochSampler) else None,
    }


def replay(loader: DataLoader, recorded: EpochDraws, batches: int) -> list[list[Any]]:
    """Make ``loader``'s next iterator the recorded epoch, ``batches`` batches in; return the skipped
    batches' indices (for :mod:`.worker_streams`). The caller then has Lightning make the iterator."""
    batch_sampler: Any = loader.batch_sampler
    if not _watched(loader) or recorded.get("sampler") is None:
        raise ValueError("replay needs a loader watched since its epoch started")
    if recorded.get("iterator") is not None:
        replaced_iterator_factory(loader).replay_next(recorded["iterator"])
    size = int(batch_sampler.batch_size)
    skipped = batch_sampler.sampler.resume(recorded["sampler"], batches * size)
    return [skipped[i : i + size] for i in range(0, len(skipped), size)]
