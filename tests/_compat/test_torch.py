"""Pins of ``lightning_resume._compat.torch`` against the installed torch: each touch does what it did."""

from __future__ import annotations

import multiprocessing
import os
import random
import zipfile
from collections.abc import Iterator
from io import BytesIO

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_resume._compat import torch as compat

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared


def test_the_serialiser_entry_point_writes_the_records_of_a_torch_save_archive() -> None:
    assert compat.torch_records_supported()
    state = {"w": torch.arange(6.0).view(2, 3), "step": 3}
    records: dict[str, object] = {}

    def keep(name: str, data: object, nbytes: int) -> None:
        records[name] = data if isinstance(data, (bytes, str)) else nbytes  # a storage: its size

    compat.record_torch_save(state, keep)
    reference = BytesIO()
    torch.save(state, reference)
    with zipfile.ZipFile(reference) as archive:
        saved = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    assert records["data.pkl"] == saved["data.pkl"]
    assert records["data/0"] == len(saved["data/0"]) == 6 * 4


def test_iter_of_a_loader_calls_the_iterator_factory_put_in_its_place() -> None:
    loader = DataLoader(list(range(4)), batch_size=2)
    made: list[str] = []
    original = compat.iterator_factory(loader)

    def factory() -> Iterator[object]:
        made.append("ours")
        return original()

    assert compat.replaced_iterator_factory(loader) is None
    compat.replace_iterator_factory(loader, factory)
    assert compat.replaced_iterator_factory(loader) is factory
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]] and made == ["ours"]


def _draw() -> torch.Tensor:
    return torch.tensor(
        [random.random(), float(np.random.rand()), float(torch.rand(()))], dtype=torch.float64
    )


class _Draws(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return _draw()


def test_seed_as_worker_seeds_as_torchs_worker_loop_does() -> None:
    loader = DataLoader(_Draws(), batch_size=1, num_workers=2, multiprocessing_context="fork")
    torch.manual_seed(7)
    drawn = [b for b in loader]
    torch.manual_seed(7)
    base = int(torch.empty((), dtype=torch.int64).random_().item())  # what the iterator draws first
    for worker in range(2):
        compat.seed_as_worker(base, worker)
        assert torch.equal(drawn[worker][0], _draw())


_FOUND: list[object] = []


def _remember_the_target() -> None:
    _FOUND.append(compat.forked_target())


def _report(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    target = _FOUND[-1] if _FOUND else None
    queue.put(getattr(target, "__name__", None))


def test_the_worker_loops_are_recognised_and_a_forked_process_names_its_target() -> None:
    from torch.utils.data._utils import worker

    assert compat.is_worker_loop(worker._worker_loop)
    assert not compat.is_worker_loop(_report)
    os.register_at_fork(after_in_child=_remember_the_target)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_report, args=(queue,))
    process.start()
    assert queue.get(timeout=30) == "_report"
    process.join()


def test_persistent_workers_count_their_batches_and_shut_down_for_new_ones() -> None:
    from torch.utils.data import TensorDataset

    from lightning_resume._compat.torch import dispatched_batches, end_persistent_workers

    data = TensorDataset(torch.arange(16.0))
    loader = DataLoader(data, batch_size=2, num_workers=2, persistent_workers=True)
    assert dispatched_batches(loader) is None
    iterator = iter(loader)
    next(iterator)
    assert dispatched_batches(loader) == 2 * 2 + 1  # prefetch_factor per worker, one more per batch given
    list(iterator)
    assert dispatched_batches(loader) == 8  # the whole epoch
    iter(loader)  # the next epoch: the same iterator, counting again
    assert loader._iterator is iterator and dispatched_batches(loader) == 4
    end_persistent_workers(loader)
    assert loader._iterator is None and not any(w.is_alive() for w in iterator._workers)
    assert next(iter(loader))[0].tolist() == [0.0, 1.0]  # new workers
    end_persistent_workers(loader)
