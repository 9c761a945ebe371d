"""Which step a checkpoint holds, read cheaply: from its manifest, else a memory-mapped load."""

from __future__ import annotations

from pathlib import Path

from lightning_resume._storage.catalog import verify
from lightning_resume._storage.kinds import DIRECTORY
from lightning_resume._storage.manifest import read_entries


def step_from_file(path: Path) -> int | None:
    """``global_step`` stored in a checkpoint, read with memory mapping (tensors are not loaded)."""
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return int(step) if step is not None else None


def saved_step(path: Path) -> int | None:
    """The step a checkpoint was saved at, from its manifest or a memory-mapped load (``None``: unknown)."""
    if path.is_dir():
        manifest = verify(path, DIRECTORY, checksums=False).manifest
        return manifest.global_step if manifest is not None else None
    entries = read_entries(path)
    if entries:
        return entries[0].global_step
    try:
        return step_from_file(path)
    except Exception:
        return None
