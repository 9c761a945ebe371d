"""Plain ``DataLoader``s back at their batch: :func:`watch` records the random state each epoch's iterator
and sampler drew from; :func:`replay` draws them again past the batches used (or drops an iterable's)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypedDict

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from lightning_resume._compat.torch import (
    iterator_factory,
    replace_iterator_factory,
    replaced_iterator_factory,
)
from lightning_resume.exact_resume import persistent_workers, rng

_END = object()


class EpochDraws(TypedDict):
    """The random state as a loader's current epoch drew: at its iterator, and as its sampler started."""

    iterator: dict[str, Any] | None
    sampler: dict[str, Any] | None


def loader_problem(loader: Any) -> str | None:
    """Why ``loader`` cannot be positioned exactly mid-epoch (``None`` when it can)."""
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} is not a torch DataLoader"
    if hasattr(loader, "state_dict") or is_iterable(loader):
        return None  # it restores its own position, or is drawn again from its epoch's start
    batch_sampler = loader.batch_sampler
    if not (hasattr(batch_sampler, "sampler") and hasattr(batch_sampler, "batch_size")):
        return f"the batch sampler {type(batch_sampler).__name__} has no sampler/batch_size to skip through"
    if persistent(loader) and not getattr(loader, "in_order", True):
        return "persistent workers with in_order=False make batches in no fixed order"
    return None


def persistent(loader: Any) -> bool:
    return isinstance(loader, DataLoader) and bool(loader.persistent_workers and loader.num_workers)


def is_iterable(loader: DataLoader) -> bool:
    return isinstance(loader.dataset, IterableDataset)


def positions(skip: int, lengths: Sequence[int | None], mode: str) -> list[int]:
    """The batches of its current pass each of several loaders gave when the combined one gave ``skip``."""
    found = []
    for length in lengths:
        if length is None or length <= 0 or skip <= length:
            found.append(skip)
        elif mode == "max_size_cycle":  # a shorter loader starts again when the next batch asks
            found.append((skip - 1) % length + 1)
        else:
            found.append(length)
    return found


def _state(generator: torch.Generator | None) -> torch.Tensor | None:
    return generator.get_state() if isinstance(generator, torch.Generator) else None


def _set(generator: torch.Generator | None, state: torch.Tensor | None) -> None:
    if isinstance(generator, torch.Generator) and state is not None:
        generator.set_state(state)


def _capture(generator: torch.Generator | None) -> dict[str, Any]:
    return {"rng": rng.capture(), "generator": _state(generator)}


class EpochSampler(Sampler[Any]):
    """A loader's sampler, wrapped: records the random state each epoch's order is drawn from."""

    def __init__(self, sampler: Any, on_start: Callable[[], None] | None = None) -> None:
        self.sampler = sampler
        self.on_start = on_start
        self.start: dict[str, Any] | None = None  # the state the current epoch's order came from
        self._pending: Iterator[Any] | None = None
        self._rewind: dict[str, Any] | None = None  # the state to start the next epoch from

    def resume(self, start: dict[str, Any], skip: int) -> list[Any]:
        """Draw the epoch that started from ``start`` again and skip (return) its first ``skip`` indices."""
        # (its own generator ends where the interrupted run's did)
        _set(getattr(self.sampler, "generator", None), start["generator"])
        with rng.scoped(start["rng"]):
            iterator = iter(self.sampler)
            skipped = list(itertools.islice(iterator, skip))  # a lazy sampler draws at its first index
        self.start, self._pending = start, iterator
        return skipped

    def start_next_from(self, state: dict[str, Any]) -> None:
        """Draw the next epoch from ``state`` (the global random state, and ``owner``'s ``generator``)."""
        self._rewind = state

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        rewind, self._rewind = self._rewind, None
        if rewind is not None:
            rng.restore(rewind["rng"])
            _set(rewind["owner"], rewind["generator"])
        self.start = _capture(getattr(self.sampler, "generator", None))
        if self.on_start is not None:
            self.on_start()
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class RecordIterator:
    """Makes a loader's iterators: records the random state each is made from, or uses a given one."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.original = iterator_factory(loader)
        self.start: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None
        self._drop = 0  # batches of the next iterator to draw and drop (an IterableDataset)

    def replay_next(self, start: dict[str, Any], drop: int = 0) -> None:
        """Make the next iterator (and its workers' seed) from ``start``; draw and drop ``drop`` batches."""
        self._pending, self._drop = start, drop

    def __call__(self) -> Any:
        pending, self._pending = self._pending, None
        if pending is None:
            self.start = _capture(self.loader.generator)
            if is_iterable(self.loader):
                self.start["dataset"] = rng.generator_states(self.loader.dataset)
            return self.original()
        if pending.get("dataset"):
            rng.set_generator_states(self.loader.dataset, pending["dataset"])
        # The loader's own generator (shared with its sampler) keeps the state the replayed sampler
        # left it in: in the interrupted run the sampler drew after the base seed.
        after = _state(self.loader.generator)
        _set(self.loader.generator, pending["generator"])
        with rng.scoped(pending["rng"]):
            iterator = self.original()
            for _ in range(self._drop):  # main-process draws come from the epoch's start state too
                if next(iterator, _END) is _END:
                    break
        _set(self.loader.generator, after)
        self.start = pending
        return iterator


def watch(loader: Any) -> bool:
    """Record the draws of ``loader``'s epochs from now on (a plain loader that can be positioned)."""
    if loader_problem(loader) is not None or hasattr(loader, "state_dict") or _watched(loader):
        return False
    replace_iterator_factory(loader, RecordIterator(loader))
    if not is_iterable(loader):  # an IterableDataset's sampler draws nothing
        on_start = persistent_workers.record(loader).epoch_started if persistent(loader) else None
        batch_sampler: Any = loader.batch_sampler
        batch_sampler.sampler = EpochSampler(batch_sampler.sampler, on_start)
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


def make_next_quietly(loader: DataLoader) -> None:
    """Have ``loader``'s next iterator draw its order from now, no base seed (a persistent workers' reset)."""
    sampler = getattr(loader.batch_sampler, "sampler", None)
    if _watched(loader) and isinstance(sampler, EpochSampler):
        sampler.start_next_from(
            {"rng": rng.capture(), "owner": loader.generator, "generator": _state(loader.generator)}
        )


def replay_iterable(loader: DataLoader, recorded: EpochDraws, batches: int) -> bool:
    """Make an ``IterableDataset``'s next iterator the recorded epoch ``batches`` in (``False``: none)."""
    if not _watched(loader) or recorded.get("iterator") is None:
        return False
    replaced_iterator_factory(loader).replay_next(recorded["iterator"], drop=batches)
    return True


def replay(loader: DataLoader, recorded: EpochDraws, batches: int, drop: int = 0) -> list[list[Any]]:
    """Make the next iterator the recorded epoch ``batches`` in (``drop``: made, dropped); skipped indices."""
    batch_sampler: Any = loader.batch_sampler
    if not _watched(loader) or recorded.get("sampler") is None:
        raise ValueError("replay needs a loader watched since its epoch started")
    if recorded.get("iterator") is not None:
        replaced_iterator_factory(loader).replay_next(recorded["iterator"], drop=drop)
    size = int(batch_sampler.batch_size)
    skipped = batch_sampler.sampler.resume(recorded["sampler"], batches * size)
    return [skipped[i : i + size] for i in range(0, len(skipped), size)]
