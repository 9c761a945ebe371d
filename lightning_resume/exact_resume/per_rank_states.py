"""The states Lightning writes for the saving rank only, kept for every rank under DDP.

Every rank builds its own checkpoint dict, but only rank 0's is written, and every rank loads that
one. A state that differs across ranks is then replaced by rank 0's on the other ranks. It differs
when it follows a value each rank computes for itself: a ``val_loss`` logged without
``sync_dist=True`` drives, on each rank, its own ``ReduceLROnPlateau`` (best value, bad epochs),
its own ``EarlyStopping`` (best score, wait count) and its own ``ModelCheckpoint(monitor=...)`` top-k.
An uninterrupted run decides with each rank's own state; a resumed one, without this module, with
rank 0's: rank 1 keeps a learning rate that rank 0 lowers, and the ranks' weights part.

:func:`capture` takes this rank's learning-rate scheduler states and callback states from the dict
Lightning built; :func:`put_back` makes Lightning load a rank's own, from ``on_load_checkpoint``
(Lightning restores callbacks and schedulers from the same dict afterwards). Callback states that
hold more than :data:`SMALL_STATE_BYTES` of tensors (averaged weights: ``StochasticWeightAveraging``,
an EMA) are left to rank 0's: they are model-sized, equal on every rank under DDP, and gathering
them would copy the model once per rank into every checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import torch
from lightning_utilities.core.apply_func import apply_to_collection

#: The most tensor bytes a callback state may hold to be kept per rank.
SMALL_STATE_BYTES = 1 << 20


class RankOwned(TypedDict):
    """One rank's learning-rate scheduler states (Lightning's order) and small callback states."""

    schedulers: list[Any]
    callbacks: dict[str, Any]


def tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (nested dicts, lists and tuples)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def _cpu(value: Any) -> Any:
    """``value`` with its tensors copied to the CPU (another rank may not have this rank's device);
    its containers keep their types (named tuples, ordered dicts, dataclasses)."""
    return apply_to_collection(value, torch.Tensor, lambda t: t.detach().cpu().clone())


def capture(checkpoint: Mapping[str, Any], own_key: str) -> RankOwned:
    """This rank's scheduler and small callback states in the ``checkpoint`` Lightning built.

    ``own_key``: the state key of the callback calling this (its state holds every rank's already).

    Example::

        mine = capture(checkpoint, self.state_key)  # in on_save_checkpoint, on every rank
    """
    callbacks = checkpoint.get("callbacks") or {}
    return {
        "schedulers": _cpu(list(checkpoint.get("lr_schedulers") or [])),
        "callbacks": {
            key: _cpu(state)
            for key, state in callbacks.items()
            if key != own_key and tensor_bytes(state) <= SMALL_STATE_BYTES
        },
    }


def put_back(checkpoint: dict[str, Any], saved: RankOwned | None) -> None:
    """Make Lightning load ``saved`` (one rank's :func:`capture`) instead of rank 0's states.

    A scheduler list of another length (the module now configures other schedulers) and callbacks
    the checkpoint does not hold are left alone: Lightning decides about those as it always does.
    """
    if not saved:
        return
    schedulers = saved.get("schedulers") or []
    if "lr_schedulers" in checkpoint and len(schedulers) == len(checkpoint["lr_schedulers"]):
        checkpoint["lr_schedulers"] = list(schedulers)
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        for key, state in (saved.get("callbacks") or {}).items():
            if key in callbacks:
                callbacks[key] = state
