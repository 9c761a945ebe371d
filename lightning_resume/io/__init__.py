"""The ``DurableCheckpointIO`` plugin, its settings, and ``sharded`` (the checkpoint directories of
sharded strategies). Torch and Lightning are imported when a name that needs them is used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_resume.io._protocol import AtomicCheckpointIO
    from lightning_resume.io.durable_checkpoint_io import DurableCheckpointIO
    from lightning_resume.io.settings import CheckpointSettings, Mirror

_LAZY = {
    "AtomicCheckpointIO": "lightning_resume.io._protocol",
    "CheckpointSettings": "lightning_resume.io.settings",
    "DurableCheckpointIO": "lightning_resume.io.durable_checkpoint_io",
    "Mirror": "lightning_resume.io.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["AtomicCheckpointIO", "CheckpointSettings", "DurableCheckpointIO", "Mirror"]
