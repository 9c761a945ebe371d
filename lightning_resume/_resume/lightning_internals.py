"""The one place that touches Lightning internals, for what Lightning offers no public route.

Pinned by ``tests/resume/test_lightning_internals.py``: when Lightning changes, that test fails loudly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import Strategy


def restart_train_iterator(trainer: pl.Trainer) -> None:
    """Create the training iterator again, as ``FitLoop.setup_data`` did before ``on_train_start``.

    Lightning 2.6 creates the iterator before any hook that can change the loader's sampler; an
    exact mid-epoch resume of a plain ``DataLoader`` has to make it again after changing it.
    """
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None:
        raise RuntimeError("Lightning has no training data fetcher yet: call this from on_train_start.")
    iter(fetcher)


def saves_directory(strategy: Strategy) -> bool | None:
    """Whether ``trainer.save_checkpoint`` writes a directory with ``strategy`` (``None``: unknown).

    Sharded saves bypass ``CheckpointIO``. Lightning keeps the choice in constructor arguments it
    stores as-is: ``ModelParallelStrategy(save_distributed_checkpoint=True)`` (the default) and
    ``FSDPStrategy(state_dict_type="sharded")`` (not the default, ``"full"``). DeepSpeed always writes
    a directory. A strategy that does not override ``Strategy.save_checkpoint`` writes one file.
    """
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, ModelParallelStrategy):
        return bool(strategy._save_distributed_checkpoint)
    if isinstance(strategy, FSDPStrategy):
        return bool(strategy._state_dict_type == "sharded")
    if type(strategy).__name__ == "DeepSpeedStrategy":  # importing it needs deepspeed installed
        return True
    if type(strategy).save_checkpoint is Strategy.save_checkpoint:
        return False
    return None


def capture_checkpoint(trainer: pl.Trainer, path: Path) -> dict[str, Any]:
    """Lightning's checkpoint for a save to ``path`` on this rank, built but not written (every rank).

    ``Trainer.save_checkpoint`` dumps the checkpoint (callback and module hooks included), hands it
    to ``strategy.save_checkpoint`` and ends with a barrier. For the duration of the call an
    instance attribute stands in for that public method and keeps the checkpoint instead, so an
    asynchronous writer can write it later.
    """
    strategy = trainer.strategy
    captured: dict[str, dict[str, Any]] = {}

    def keep(checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        captured["checkpoint"] = checkpoint

    strategy.save_checkpoint = keep  # type: ignore[method-assign]
    try:
        trainer.save_checkpoint(path, weights_only=False)
    finally:
        del strategy.save_checkpoint
    return captured["checkpoint"]
