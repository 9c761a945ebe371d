"""Pins of ``lightning_resume._compat.torchdata`` against the installed torchdata."""

from __future__ import annotations

import importlib

from torch.utils.data import RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resume._compat import torchdata


def test_the_shuffling_sampler_of_a_stateful_loader_is_recognised() -> None:
    shuffled = StatefulDataLoader(list(range(8)), batch_size=2, shuffle=True)
    assert torchdata.is_random_sampler(shuffled.sampler)
    assert not torchdata.is_random_sampler(StatefulDataLoader(list(range(8)), batch_size=2).sampler)
    assert not torchdata.is_random_sampler(RandomSampler(list(range(8))))  # torch's own


def test_the_worker_loop_of_a_stateful_loader_is_where_it_is_named() -> None:
    module, name = torchdata.WORKER_LOOP
    assert callable(getattr(importlib.import_module(module), name))
