"""The states Lightning writes for the saving rank only, kept for every rank under DDP.

Every rank loads rank 0's checkpoint, but a ``ReduceLROnPlateau``, ``EarlyStopping`` or
``ModelCheckpoint(monitor=...)`` following a ``val_loss`` logged without ``sync_dist=True`` has its own
state on each rank: resumed with rank 0's, the ranks' learning rates and weights part. Callback states
over :data:`SMALL_STATE_BYTES` of tensors (SWA, EMA weights) are equal and model-sized: left to rank 0's.
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
    """``value`` with its tensors copied to the CPU (another rank may lack this device), containers kept."""
    return apply_to_collection(value, torch.Tensor, lambda t: t.detach().cpu().clone())


def capture(checkpoint: Mapping[str, Any], own_key: str) -> RankOwned:
    """This rank's scheduler and small callback states in the ``checkpoint`` Lightning built, but for
    ``own_key``'s (the caller's, which holds every rank's already)."""
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
    """Make Lightning load ``saved`` (one rank's :func:`capture`) instead of rank 0's states; schedulers
    of another number and callbacks the checkpoint does not hold are left to Lightning."""
    if not saved:
        return
    schedulers = saved.get("schedulers") or []
    if "lr_schedulers" in checkpoint and len(schedulers) == len(checkpoint["lr_schedulers"]):
        checkpoint["lr_schedulers"] = list(schedulers)
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        callbacks.update({k: v for k, v in (saved.get("callbacks") or {}).items() if k in callbacks})
