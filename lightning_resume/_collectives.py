"""Every collective the package runs, in one place.

Callbacks agree across ranks only through these functions, never with ``torch.distributed``
directly (a test enforces it).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

T = TypeVar("T")


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (every rank must call this at the same point)."""
    if not _distributed():
        return flag
    tensor = torch.tensor([int(flag)], dtype=torch.int32)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return bool(tensor.item())


def gather_objects(obj: T) -> list[T]:
    """``obj`` of every rank, by global rank (every rank must call this at the same point)."""
    if not _distributed():
        return [obj]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered
