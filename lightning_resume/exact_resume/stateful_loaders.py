"""Exact mid-epoch resume of torchdata ``StatefulDataLoader``s under DDP (Lightning saves rank 0's loader
state only, makes the resumed iterator before ``set_epoch`` and wraps torchdata's ``RandomSampler``)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

from lightning_resume._compat.lightning import wrapped_sampler
from lightning_resume._compat.torchdata import is_random_sampler


def is_stateful(loader: Any) -> bool:
    return all(callable(getattr(loader, name, None)) for name in ("state_dict", "load_state_dict"))


def unwrap_random_sampler(loader: DataLoader) -> bool:
    """Unwrap a torchdata ``RandomSampler`` to the ``DistributedSampler`` torch's gets; whether it did."""
    batch_sampler = loader.batch_sampler
    wrapper: Any = getattr(batch_sampler, "sampler", None)
    inner = wrapped_sampler(wrapper)
    if inner is None or not is_random_sampler(inner):
        return False
    batch_sampler.sampler = DistributedSampler(  # type: ignore[union-attr]
        loader.dataset,
        num_replicas=wrapper.num_replicas,
        rank=wrapper.rank,
        shuffle=True,
        seed=wrapper.seed,
        drop_last=wrapper.drop_last,
    )
    return True


def distributed_samplers(loader: DataLoader) -> list[DistributedSampler]:
    """The ``DistributedSampler``s that decide ``loader``'s order (sampler or batch sampler's sampler)."""
    samplers = (getattr(loader, "sampler", None), getattr(loader.batch_sampler, "sampler", None))
    found = {id(sampler): sampler for sampler in samplers if isinstance(sampler, DistributedSampler)}
    return list(found.values())


def hidden_sampler_problem(loader: DataLoader) -> str | None:
    """Why a wrapped sampler's order cannot be resumed exactly (``None`` when it can)."""
    inner = wrapped_sampler(getattr(loader.batch_sampler, "sampler", None))
    if inner is None or is_random_sampler(inner):
        return None
    return (
        f"Lightning wraps the train sampler {type(inner).__name__} in its DistributedSamplerWrapper, "
        "whose order after a restart is not saved in the loader state: pass a DistributedSampler "
        "(or torchdata's StatefulDistributedSampler) yourself, with Trainer(use_distributed_sampler=False)"
    )
