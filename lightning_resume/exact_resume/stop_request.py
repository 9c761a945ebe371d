"""A stop asked for before ``min_steps``/``min_epochs`` are met is asked for again after a restart.

``EarlyStopping`` (or any callback) sets ``trainer.should_stop``; Lightning keeps training until the
minimum is met and then stops, but saves no trace of the request. A run restored from a checkpoint
taken in between would train on to ``max_steps``: the request is kept in ``RequeueCheckpoint``'s
state and set again when the same run restarts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from lightning_resume._compat.lightning import stop_deferred

KEY = "stop_deferred"


def to_save(trainer: pl.Trainer | None) -> dict[str, bool]:
    """The part of the callback's state that says whether a deferred stop was asked for."""
    return {KEY: trainer is not None and stop_deferred(trainer)}


def requested(state: Mapping[str, Any] | None, restart: bool) -> bool:
    """Whether to ask for the stop again: the loaded state holds a deferred stop and this is a
    restart of the run that saved it (a new run started from its checkpoint decides afresh)."""
    return restart and state is not None and bool(state.get(KEY))
