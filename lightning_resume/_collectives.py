"""Every collective the package runs, only through Lightning's strategy API (``tests/test_collectives.py``
checks). Every rank must call them at the same points; tensors live on ``strategy.root_device`` (NCCL)."""

from __future__ import annotations

import io
import pickle
from typing import Any, TypeGuard, TypeVar

import torch
from lightning.pytorch.strategies import ParallelStrategy, Strategy

T = TypeVar("T")


def _distributed(strategy: Strategy) -> TypeGuard[ParallelStrategy]:
    return isinstance(strategy, ParallelStrategy) and strategy.world_size > 1


def any_rank(strategy: Strategy, flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (one small all-reduce)."""
    if not _distributed(strategy):
        return flag
    return bool(strategy.reduce_boolean_decision(flag, all=False))


def max_over_ranks(strategy: Strategy, value: int) -> int:
    """The largest ``value`` of any rank (one small all-reduce), so that every rank acts on the same one."""
    if not _distributed(strategy):
        return value
    tensor = torch.tensor(value, dtype=torch.int64, device=strategy.root_device)
    return int(strategy.reduce(tensor, reduce_op="max").item())


def broadcast(strategy: Strategy, obj: T) -> T:
    return strategy.broadcast(obj, src=0) if _distributed(strategy) else obj


def barrier(strategy: Strategy, name: str) -> None:
    if _distributed(strategy):
        strategy.barrier(name)


def gather_numbers(strategy: Strategy, values: list[float]) -> list[list[float]]:
    """``values`` (the same count on every rank) of every rank, by global rank: one small all-gather."""
    if not _distributed(strategy):
        return [list(values)]
    tensor = torch.tensor(values, dtype=torch.float64, device=strategy.root_device)
    gathered: list[list[float]] = strategy.all_gather(tensor).reshape(strategy.world_size, -1).cpu().tolist()
    return gathered


def gather_objects(strategy: Strategy, obj: T) -> list[T]:
    """``obj`` of every rank, by global rank: pickled, length first, in a fixed-size all-gather when every
    payload fits, else a second one padded to the longest."""
    if not _distributed(strategy):
        return [obj]
    device, world = strategy.root_device, strategy.world_size
    payload = _dumps(obj)
    # Inline bytes per rank: 64 KiB (a rank's random and loader states are tens of KiB), less on large
    # worlds so that the gathered buffer stays ~4 MiB.
    inline = max(1024, min(64 * 1024, (4 * 1024 * 1024) // world))
    buffer = torch.zeros(_HEADER + inline, dtype=torch.uint8)
    buffer[:_HEADER] = torch.tensor([len(payload)], dtype=torch.int64).view(torch.uint8)
    if len(payload) <= inline:
        buffer[_HEADER : _HEADER + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    rows = strategy.all_gather(buffer.to(device)).reshape(world, -1).cpu()
    sizes = [int(n) for n in rows[:, :_HEADER].contiguous().view(torch.int64).reshape(-1).tolist()]
    if max(sizes) <= inline:
        data = rows[:, _HEADER:]
    else:
        padded = torch.zeros(max(sizes), dtype=torch.uint8)
        padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        data = strategy.all_gather(padded.to(device)).reshape(world, -1).cpu()
    return [pickle.loads(data[rank, :n].numpy().tobytes()) for rank, n in enumerate(sizes)]


#: The length in front of each rank's payload (int64).
_HEADER = 8


class _Pickler(pickle.Pickler):
    """``pickle`` with plain CPU tensors as raw bytes: torch's own takes ~0.1 ms per tensor to load."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and _raw_copyable(obj):
            data = obj.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
            return _tensor_from_bytes, (data, obj.dtype, tuple(obj.shape))
        return NotImplemented


def _raw_copyable(tensor: torch.Tensor) -> bool:
    """A dense, contiguous CPU tensor whose bytes are its values, without autograd history to keep."""
    return (
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and not tensor.requires_grad
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
        and tensor.dim() > 0
    )


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _dumps(obj: Any) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


def gather_objects_on(group: Any, obj: T) -> list[T]:
    """``obj`` of every rank of ``group`` (a :func:`cpu_group`), for threads off the training loop."""
    if group is None or not torch.distributed.is_initialized():
        return [obj]
    found: list[Any] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(found, obj, group=group)
    return found


def cpu_group(strategy: Strategy) -> Any:
    """A new gloo group of every rank (``None`` when not distributed), for collectives off the main thread
    (DCP's asynchronous save), which would deadlock with training's on the default group."""
    if not _distributed(strategy):
        return None
    return torch.distributed.new_group(backend="gloo")
