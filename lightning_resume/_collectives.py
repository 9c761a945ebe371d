"""Every collective the package runs, in one place, and only through Lightning's strategy API.

The strategy knows the backend and the device: with NCCL (Lightning's default for CUDA DDP) a
collective on a CPU tensor fails, so every tensor handed to a collective here is created on
``strategy.root_device``, as Lightning's own ``reduce_boolean_decision`` does. Nothing else in the
package calls a collective; ``tests/test_collectives.py`` checks the source for it.

Every rank must call these functions at the same point of the program, in the same order.
"""

from __future__ import annotations

import pickle
from typing import Any, TypeVar

import torch
from lightning.pytorch.strategies import ParallelStrategy, Strategy

T = TypeVar("T")


def _distributed(strategy: Strategy) -> bool:
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
    """Global rank 0's ``obj``, on every rank."""
    return strategy.broadcast(obj, src=0) if _distributed(strategy) else obj


def barrier(strategy: Strategy, name: str) -> None:
    """Wait until every rank gets here."""
    if _distributed(strategy):
        strategy.barrier(name)


def gather_objects(strategy: Strategy, obj: T) -> list[T]:
    """``obj`` of every rank, by global rank.

    The object is pickled into a byte tensor on the strategy's device; two all-gathers (the sizes,
    then the padded bytes) bring every rank's bytes to every rank.
    """
    if not _distributed(strategy):
        return [obj]
    device = strategy.root_device
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [int(n) for n in strategy.all_gather(size).reshape(-1).tolist()]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    gathered = strategy.all_gather(padded).reshape(len(sizes), -1).cpu()
    found: list[Any] = [pickle.loads(gathered[rank, :n].numpy().tobytes()) for rank, n in enumerate(sizes)]
    return found


def cpu_group(strategy: Strategy) -> Any:
    """A new process group of every rank on the CPU backend (gloo), for collectives run off the main
    thread (DCP's asynchronous save), which would deadlock with training's on the default group.

    ``None`` when not distributed. Every rank must call this at the same point.
    """
    if not _distributed(strategy):
        return None
    return torch.distributed.new_group(backend="gloo")
