"""A one-shot ``CheckpointIO`` wrapper that makes a restarted job load its own ``last.ckpt``.

Lightning picks the checkpoint to resume before any callback hook runs (a user ``ckpt_path``, the
newest ``last`` file, or an ``hpc_ckpt_N.ckpt`` under SLURM). The first hook, ``setup``, runs before
that checkpoint is read, so a callback can swap the strategy's ``checkpoint_io`` (a public setter)
for this wrapper: the first load goes to the run's own ``last.ckpt`` and the wrapper removes itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import Strategy
from typing_extensions import override

from lightning_resume.exceptions import ResumeError
from lightning_resume.io._protocol import AtomicCheckpointIO
from lightning_resume.io._verified_load import intact_zip

log = logging.getLogger(__name__)


class RedirectFirstLoad(CheckpointIO):
    """Delegate everything to ``inner``; send the first ``load_checkpoint`` to ``target``.

    Args:
        strategy: The strategy whose ``checkpoint_io`` this wrapper replaced; restored after the load.
        inner: The plugin that does the real work.
        target: The path every first load is redirected to.
        on_redirect: Called with the requested path when it differs from ``target``.
    """

    def __init__(
        self, strategy: Strategy, inner: CheckpointIO, target: str, on_redirect: Callable[[str], None]
    ) -> None:
        self.strategy = strategy
        self.inner = inner
        self.target = target
        self.on_redirect = on_redirect

    def uninstall(self) -> None:
        if self.strategy.checkpoint_io is self:
            self.strategy.checkpoint_io = self.inner

    @override
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        self.uninstall()
        if os.path.abspath(str(path)) != os.path.abspath(self.target):
            self.on_redirect(str(path))
            path = self.target
        try:
            return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except Exception as e:
            if isinstance(self.inner, AtomicCheckpointIO) or intact_zip(Path(path)):
                raise  # the plugin explains its own failures; an intact file failed for another reason
            raise ResumeError(
                f"The restart cannot load {str(path)!r}: it is damaged (loading raised {type(e).__name__}; "
                "it is not a complete checkpoint archive). It was "
                "written without DurableCheckpointIO, so there is no verified copy to fall back to. Restore "
                "it from a copy, or remove it and checkpoints/.saved to start the run over (the earlier "
                "training is then lost). DurableCheckpointIO verifies every checkpoint and keeps the "
                "previous one loadable.",
                path,
            ) from e

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    @override
    def remove_checkpoint(self, path: _PATH) -> None:
        self.inner.remove_checkpoint(path)

    @override
    def teardown(self) -> None:
        self.inner.teardown()
