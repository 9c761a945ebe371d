"""Checkpoints written before the package moved into subpackages still resume.

``tests/data/last-0.1-layout.ckpt`` was written by ``RunDir`` + ``RequeueCheckpoint`` of the flat
layout (``BoringModel``, 3 steps). Lightning keys callback state by class name, not module path.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir

OLD = Path(__file__).resolve().parent / "data" / "last-0.1-layout.ckpt"


def test_a_checkpoint_of_the_flat_layout_restores_every_callback_state(tmp_path: Path) -> None:
    old = torch.load(OLD, weights_only=True)
    assert sorted(old["callbacks"]) == ["RequeueCheckpoint", "RunDir"]
    run_dir = RunDir(root=tmp_path / "root")
    requeue = RequeueCheckpoint(every_n_train_steps=1)
    loaded: dict[str, dict[str, Any]] = {}
    for callback in (run_dir, requeue):
        original = callback.load_state_dict
        callback.load_state_dict = partial(spy, loaded, type(callback).__name__, original)  # type: ignore[method-assign]
    copy = tmp_path / "old.ckpt"
    shutil.copy(OLD, copy)
    trainer = tiny_trainer(
        run_dir, requeue, tmp_path=tmp_path, max_steps=5, limit_train_batches=8, max_epochs=2
    )
    trainer.fit(BoringModel(), ckpt_path=copy)  # a fresh run may start from another run's checkpoint
    assert loaded["RunDir"]["run_id"] == old["callbacks"]["RunDir"]["run_id"]
    assert loaded["RequeueCheckpoint"]["global_step"] == 3
    assert len(loaded["RequeueCheckpoint"]["ranks"]) == 1
    saved = torch.load(run_dir.checkpoint_dir / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 5


def spy(
    seen: dict[str, Any], name: str, original: Callable[[dict[str, Any]], None], state: dict[str, Any]
) -> None:
    seen[name] = state
    original(state)
