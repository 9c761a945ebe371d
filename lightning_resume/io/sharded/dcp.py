"""What a strategy's checkpoint directory holds: DCP's keys, the files a load needs, the layout."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import Strategy

from lightning_resume.io.sharded.parts import DCP_REQUIRED


def uses_dcp(strategy: Strategy) -> bool:
    """Whether the strategy writes its sharded checkpoints with ``torch.distributed.checkpoint``."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    return isinstance(strategy, (ModelParallelStrategy, FSDPStrategy))


def model_key(strategy: Strategy) -> str:
    """The key of the model state in the strategy's DCP checkpoint (what its own load reads)."""
    from lightning.pytorch.strategies import FSDPStrategy

    return "model" if isinstance(strategy, FSDPStrategy) else "state_dict"


def dcp_state(strategy: Strategy, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Take the sharded state out of Lightning's ``checkpoint``, keyed as the strategy's save does.

    What remains of ``checkpoint`` is Lightning's ``meta.pt``.
    """
    state = {model_key(strategy): checkpoint.pop("state_dict")}
    state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
    return state


def save_planner() -> Any:
    """DCP's default planner, reusing the save plan of the previous save when no rank's plan changed.

    The plan (which rank writes which item where) is the same at every save of one run; caching it
    spares the writer thread the plans' gather, the global planning and their scatter. DCP keys its
    cache by the planner's class name: a subclass of our own keeps ours apart from the user's DCP
    saves. DCP compares each rank's new local plan with the cached one and plans again when one
    differs. Torch without plan caching (before 2.6) gets the plain planner.
    """
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
    """``torch.save`` without its CRC32 of each record while the block runs.

    DCP's files are one ``torch.save`` per tensor, and the CRC32 torch computes over every byte is
    about a fifth of their write (40 ms of 210 ms per 96 MB rank in ``benchmarks/sharded_checkpoint.py``).
    ``torch.load`` never checks it (a flipped byte loads silently); our manifest's checksum of every
    file is what a load verifies. The setting (``torch.serialization.set_crc32_options``) is kept per
    thread by torch 2.13 (checked); where a torch keeps it process-wide, a ``torch.save`` of another
    thread during the block writes no CRC32 either, and loads the same. Torch without the setting:
    nothing changes.
    """
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
