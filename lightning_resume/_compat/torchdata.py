"""Every touch of torchdata's internals, pinned by ``tests/_compat/test_torchdata.py``."""

from __future__ import annotations

from typing import Any

#: torchdata's ``StatefulDataLoader`` worker loop: the target of every worker process it starts.
WORKER_LOOP = ("torchdata.stateful_dataloader.worker", "_worker_loop")


def is_random_sampler(sampler: Any) -> bool:
    """Whether ``sampler`` is the ``RandomSampler`` torchdata's ``StatefulDataLoader(shuffle=True)``
    makes: without replacement, over the whole dataset (``_num_samples`` unset)."""
    cls = type(sampler)
    return (
        cls.__name__ == "RandomSampler"
        and cls.__module__.startswith("torchdata.stateful_dataloader")
        and not getattr(sampler, "replacement", True)
        and getattr(sampler, "_num_samples", 0) is None
    )
