"""The states Lightning saves for rank 0 only, kept for every rank under DDP: schedulers and callbacks that
follow an unsynced metric (``ReduceLROnPlateau``, ``EarlyStopping``) differ per rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import torch
from lightning_utilities.core.apply_func import apply_to_collection

#: The most tensor bytes a callback state may hold to be kept per rank (SWA's, EMA's weights: rank 0's only).
SMALL_STATE_BYTES = 1 << 20


class RankOwned(TypedDict):
    """One rank's learning-rate scheduler states (Lightning's order) and small callback states."""

    schedulers: list[Any]
    callbacks: dict[str, Any]


def tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def cpu_copy(value: Any) -> Any:
    """``value`` with its tensors copied to the CPU (another rank may lack this device), containers kept."""
    return apply_to_collection(value, torch.Tensor, lambda t: t.detach().cpu().clone())


def capture(checkpoint: Mapping[str, Any], own_key: str) -> RankOwned:
    """This rank's scheduler and small callback states in ``checkpoint`` but ``own_key``'s (the caller's)."""
    callbacks = checkpoint.get("callbacks") or {}
    return {
        "schedulers": cpu_copy(list(checkpoint.get("lr_schedulers") or [])),
        "callbacks": {
            key: cpu_copy(state)
            for key, state in callbacks.items()
            if key != own_key and tensor_bytes(state) <= SMALL_STATE_BYTES
        },
    }


def put_back(checkpoint: dict[str, Any], saved: RankOwned | None) -> None:
    """Have Lightning load ``saved`` (one rank's :func:`capture`) instead of rank 0's, where the two match."""
    if not saved:
        return
    schedulers = saved.get("schedulers") or []
    if "lr_schedulers" in checkpoint and len(schedulers) == len(checkpoint["lr_schedulers"]):
        checkpoint["lr_schedulers"] = list(schedulers)
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        callbacks.update({k: v for k, v in (saved.get("callbacks") or {}).items() if k in callbacks})
