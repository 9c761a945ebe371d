"""What a strategy's checkpoint directory holds: DCP's keys, the files a load needs, the layout."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy

from lightning_resume.io.sharded.parts import DCP_REQUIRED


def uses_dcp(strategy: Strategy) -> bool:
    """Whether the strategy writes its sharded checkpoints with ``torch.distributed.checkpoint``."""
    return isinstance(strategy, (ModelParallelStrategy, FSDPStrategy))


def model_key(strategy: Strategy) -> str:
    """The key of the model state in the strategy's DCP checkpoint (what its own load reads)."""
    return "model" if isinstance(strategy, FSDPStrategy) else "state_dict"


def dcp_state(strategy: Strategy, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Take the sharded state out of ``checkpoint`` (leaving ``meta.pt``), keyed as the strategy's save."""
    state = {model_key(strategy): checkpoint.pop("state_dict")}
    state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
    return state


def save_planner() -> Any:
    """DCP's default planner, reusing the previous save plan where torch can (a cache keyed by class name)."""
    return _planner_factory()()


@functools.cache
def _planner_factory() -> Callable[[], Any]:
    from torch.distributed.checkpoint import DefaultSavePlanner

    class LightningResumeSavePlanner(DefaultSavePlanner):
        """``DefaultSavePlanner`` under a name of its own (the key of DCP's plan cache)."""

    if "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters:
        return functools.partial(LightningResumeSavePlanner, enable_plan_caching=True)
    return LightningResumeSavePlanner


@contextlib.contextmanager
def without_torch_crc32() -> Iterator[None]:
    """``torch.save`` without its CRC32 of each record in the block (a fifth of DCP's write; our manifest
    checks the bytes). Per thread in torch 2.13; where process-wide, other threads' saves lack it too."""
    serialization: Any = torch.serialization
    if not hasattr(serialization, "set_crc32_options"):
        yield
        return
    before = serialization.get_crc32_options()
    serialization.set_crc32_options(False)
    try:
        yield
    finally:
        serialization.set_crc32_options(before)


def required_files(strategy: Strategy) -> tuple[str, ...]:
    """Files a load of the strategy's checkpoint directory cannot do without."""
    return DCP_REQUIRED if uses_dcp(strategy) else ()


def layout_of(strategy: Strategy, writer: str) -> dict[str, Any]:
    """How a checkpoint was written, for its manifest: the strategy, its device mesh, the writer."""
    layout: dict[str, Any] = {"strategy": type(strategy).__name__, "writer": writer}
    try:
        mesh = getattr(strategy, "device_mesh", None)
    except RuntimeError:  # ModelParallelStrategy before setup
        mesh = None
    if mesh is not None:
        layout["mesh"] = {"shape": list(mesh.shape), "names": list(mesh.mesh_dim_names or ())}
    return layout
