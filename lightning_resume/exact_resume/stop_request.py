"""A stop asked for before ``min_steps``/``min_epochs`` are met is asked for again after a restart (Lightning
saves no trace of ``trainer.should_stop``: a run restored in between would train on to ``max_steps``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from lightning_resume._compat.lightning import stop_deferred

KEY = "stop_deferred"


def to_save(trainer: pl.Trainer) -> dict[str, bool]:
    return {KEY: stop_deferred(trainer)}


def requested(state: Mapping[str, Any] | None, restart: bool) -> bool:
    """Whether ``state`` holds a deferred stop and this restarts the run that saved it (not a new run)."""
    return restart and state is not None and bool(state.get(KEY))
