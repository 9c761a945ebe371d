"""A one-shot wrapper of ``strategy.load_checkpoint`` that makes a restarted job load its own ``last.ckpt``.

Sharded strategies (``ModelParallelStrategy``, ``FSDPStrategy(state_dict_type="sharded")``, DeepSpeed)
load in ``Strategy.load_checkpoint`` and never call a ``CheckpointIO`` plugin, so
:class:`~lightning_resume.io._redirect_first_load.RedirectFirstLoad` cannot catch their load. Lightning
calls ``trainer.strategy.load_checkpoint(path, weights_only=...)`` once per ``fit``, after the callbacks'
``setup``; this wrapper, set on the strategy instance in ``setup``, sends that call to ``last.ckpt`` and
removes itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lightning.pytorch.strategies import Strategy

from lightning_resume.exceptions import ResumeError


class RedirectFirstStrategyLoad:
    """Send the strategy's first ``load_checkpoint`` to ``target``; then put the method back.

    Args:
        strategy: The strategy whose ``load_checkpoint`` this replaces (an instance attribute).
        target: The checkpoint every first load is redirected to (``last.ckpt``).
        on_redirect: Called with the requested path when it differs from ``target``.
        saved_world_size: How many ranks wrote ``target``; a load failure on a different number of
            ranks is reported as a :class:`~lightning_resume.ResumeError` naming both.
        world_size: How many ranks this run has.
    """

    def __init__(
        self,
        strategy: Strategy,
        target: str,
        on_redirect: Callable[[str], None],
        saved_world_size: int,
        world_size: int,
    ) -> None:
        self.strategy = strategy
        self.target = target
        self.on_redirect = on_redirect
        self.saved_world_size = saved_world_size
        self.world_size = world_size
        self.original = strategy.load_checkpoint

    def install(self) -> None:
        self.strategy.load_checkpoint = self  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self.strategy.__dict__.get("load_checkpoint") is self:
            del self.strategy.load_checkpoint

    @property
    def installed(self) -> bool:
        return self.strategy.__dict__.get("load_checkpoint") is self

    def __call__(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.uninstall()
        if os.path.abspath(str(checkpoint_path)) != os.path.abspath(self.target):
            self.on_redirect(str(checkpoint_path))
        try:
            loaded: dict[str, Any] = self.original(self.target, *args, **kwargs)
        except Exception as e:
            if self.saved_world_size == self.world_size:
                raise
            raise ResumeError(
                f"{self.target!r} was written by {self.saved_world_size} rank(s) and cannot be loaded on "
                f"{self.world_size} rank(s) ({type(e).__name__}: {e}). Restart with "
                f"{self.saved_world_size} rank(s), or with a layout torch.distributed.checkpoint can reshard "
                "into.",
                self.target,
            ) from e
        return loaded
