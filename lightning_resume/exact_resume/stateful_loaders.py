"""Exact mid-epoch resume of torchdata ``StatefulDataLoader``s under DDP.

A ``StatefulDataLoader`` restores its position exactly, but under DDP three things around it do not
(lightning 2.6.6, torchdata 0.11):

1. Lightning saves the loader state of rank 0 only, and every rank loads it.
2. ``FitLoop.setup_data`` builds the resumed iterator before ``set_epoch`` is called for the epoch,
   so a ``DistributedSampler`` resumes in epoch 0's order.
3. ``shuffle=True`` gives torchdata's own ``RandomSampler``, which Lightning does not recognise as
   a ``RandomSampler`` and wraps in its ``DistributedSamplerWrapper``: the permutation then comes
   from the inner sampler's generator, which is in no saved state and is advanced once per
   ``iter()``; a restore calls ``iter()`` two more times than a fresh epoch does.

The fixes here: treat torchdata's ``RandomSampler`` the way Lightning treats torch's (a plain
``DistributedSampler``, whose order is a function of seed and epoch), set the epoch, then rebuild
the iterator from this rank's state.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

from lightning_resume._compat.lightning import wrapped_sampler
from lightning_resume._compat.torchdata import is_random_sampler


def is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def unwrap_random_sampler(loader: DataLoader) -> bool:
    """Replace Lightning's wrapper around a torchdata ``RandomSampler`` with a ``DistributedSampler``.

    Lightning does the same for torch's ``RandomSampler``: ``DistributedSampler(dataset,
    shuffle=True, seed=$PL_GLOBAL_SEED)``. Returns whether the loader was changed.
    """
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
    found = {}
    for sampler in (getattr(loader, "sampler", None), getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(sampler, DistributedSampler):
            found[id(sampler)] = sampler
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
