"""Persistent workers' random streams (they go on across epochs): each worker writes them to shared memory
as it starts and after each batch; a save keeps each's before the round, a resume starts anew from those."""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from lightning_resume._compat.torch import dispatched_batches
from lightning_resume.exact_resume import rng

#: The most bytes one worker's state may take (its generators pickled); more: not recorded.
SLOT_BYTES = 1 << 15


class Records:
    """Shared memory for each worker's states, a ring of ``slots`` entries (``c``: before its batch ``c``)."""

    def __init__(self, workers: int, slots: int) -> None:
        self.slots = slots
        self.numbers = torch.full((workers, slots), -1, dtype=torch.int64).share_memory_()
        self.lengths = torch.zeros((workers, slots), dtype=torch.int64).share_memory_()
        self.data = torch.zeros((workers, slots, SLOT_BYTES), dtype=torch.uint8).share_memory_()
        self.latest = torch.full((workers,), -1, dtype=torch.int64).share_memory_()

    def write(self, worker: int, entry: int, payload: bytes) -> None:
        slot = entry % self.slots
        self.numbers[worker, slot] = -1
        fits = len(payload) <= SLOT_BYTES
        if fits:
            self.data[worker, slot, : len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        self.lengths[worker, slot] = len(payload) if fits else 0
        self.numbers[worker, slot] = entry
        self.latest[worker] = entry

    def read(self, worker: int, entry: int, wait: float = 10.0) -> bytes | None:
        """``worker``'s ``entry``, waited for up to ``wait`` s (``None``: overwritten, too big, or never)."""
        slot, deadline = entry % self.slots, time.monotonic() + wait
        while True:
            number = int(self.numbers[worker, slot])
            if number == entry:
                length = int(self.lengths[worker, slot])
                payload = bytes(self.data[worker, slot, :length].numpy())
                if int(self.numbers[worker, slot]) == entry:  # not written over while copied
                    return payload if length else None
            elif number > entry or time.monotonic() > deadline:  # written over, or never written
                return None
            time.sleep(0.001)


def _state(dataset: Any) -> bytes:
    return pickle.dumps({"rng": rng.capture(), "dataset": rng.generator_states(dataset)})


_ENTRY: dict[str, int] = {}  # in a worker process: the number of its next entry


@dataclass(eq=False)
class RecordingInit:
    """A persistent loader's ``worker_init_fn``: the user's, the saved states (a resume), the first entry."""

    user_fn: Callable[[int], None] | None
    records: Records
    first: list[int]  # each worker's first entry number (0, or where a resume continues)
    states: list[bytes] | None = None  # what a resume's workers start from
    starts: list[int] = field(default_factory=list)  # each worker's entry as the current epoch began
    fresh: bool = True  # workers were just made: the next epoch starts at ``first``

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None, "RecordingInit runs in data-loader workers only"
        if self.user_fn is not None:
            self.user_fn(worker_id)
        if self.states is not None:
            saved = pickle.loads(self.states[worker_id])
            rng.restore(saved["rng"])
            rng.set_generator_states(info.dataset, saved["dataset"])
        _ENTRY["next"] = self.first[worker_id]
        self.records.write(worker_id, _ENTRY["next"], _state(info.dataset))

    def epoch_started(self) -> None:
        """In the main process, as an epoch's order is drawn (every worker idle): its starting entries."""
        if self.fresh:
            self.starts, self.fresh = list(self.first), False
        else:
            self.starts = [int(v) for v in self.records.latest]

    def restart(self, entries: list[int], states: list[bytes], round_start: int, next_epoch: bool) -> None:
        """Fresh workers from ``states`` at ``entries``: for the next epoch, or this one from a round."""
        self.first, self.states, self.fresh = list(entries), states, next_epoch
        self.starts = [e - round_start // len(entries) for e in entries]


@dataclass(eq=False)
class RecordingCollate:
    """A persistent loader's ``collate_fn``: the user's, then (in a worker) the entry after the batch."""

    collate_fn: Callable[[Any], Any]
    records: Records

    def __call__(self, data: Any) -> Any:
        batch = self.collate_fn(data)
        info = get_worker_info()
        if info is not None:
            _ENTRY["next"] += 1
            self.records.write(info.id, _ENTRY["next"], _state(info.dataset))
        return batch


def record(loader: DataLoader) -> RecordingInit:
    """Have ``loader``'s (persistent) workers record their states from its next new workers on."""
    workers, ahead = loader.num_workers, loader.prefetch_factor or 2
    records = Records(workers, slots=2 * ahead + 4)
    init = RecordingInit(loader.worker_init_fn, records, first=[0] * workers)
    loader.worker_init_fn = init
    loader.collate_fn = RecordingCollate(loader.collate_fn, records)
    return init


def recording(loader: Any) -> RecordingInit | None:
    init = getattr(loader, "worker_init_fn", None)
    return init if isinstance(init, RecordingInit) else None


def save(loader: DataLoader, batches: int, between: bool) -> dict[str, Any] | None:
    """Each worker's entry and state to resume from: in the round of ``batches``, or before the next epoch."""
    init = recording(loader)
    if init is None or not init.starts:
        return None
    workers = len(init.starts)
    if between:
        made = dispatched_batches(loader)  # batches handed to the workers this epoch
        if made is None:
            return None
        entries = [s + max(math.ceil((made - w) / workers), 0) for w, s in enumerate(init.starts)]
    else:
        entries = [s + batches // workers for s in init.starts]
    states = [init.records.read(w, entry) for w, entry in enumerate(entries)]
    if any(state is None for state in states):
        return None
    round_start = 0 if between else batches - batches % workers
    return {"entries": entries, "states": states, "round_start": round_start}
