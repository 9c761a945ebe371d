"""What is logged at an epoch's end, and what callbacks read, saved with a checkpoint and put back.

Three things accumulate outside any ``state_dict`` Lightning saves: the module's ``torchmetrics.Metric``
states (``persistent=False`` by default), what ``self.log(..., on_epoch=True)`` summed so far, and
``trainer.callback_metrics`` (read by ``EarlyStopping``, ``ModelCheckpoint(monitor=...)``,
``ReduceLROnPlateau``). Without them a resumed epoch logs the mean of its resumed batches only, and a
callback finds no validation metric before the next validation.
"""

from __future__ import annotations

from typing import Any, TypedDict

import lightning.pytorch as pl
import torch

from lightning_resume._compat.lightning import (
    callback_metrics,
    epoch_accumulators,
    put_back_callback_metrics,
    put_back_epoch_accumulators,
)
from lightning_resume._compat.torchmetrics import set_update_count


class EpochMetrics(TypedDict):
    """One rank's metric states (``module``), epoch accumulators (``logged``), callback metrics."""

    module: dict[str, dict[str, Any]]
    logged: list[dict[str, Any]]
    callback: dict[str, torch.Tensor]


def _metrics(module: torch.nn.Module) -> dict[str, Any]:
    """The ``torchmetrics.Metric`` objects of ``module``, by their name in ``named_modules()``."""
    try:
        from torchmetrics import Metric
    except ImportError:  # torchmetrics is optional
        return {}
    return {name: m for name, m in module.named_modules() if isinstance(m, Metric)}


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, list):  # a "cat" state: a list of tensors
        return [_copy(v) for v in value]
    return value


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    return value


def metric_states(module: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Every ``torchmetrics.Metric``'s accumulated state and update count, copied to the CPU."""
    return {
        name: {
            "state": {k: _copy(v) for k, v in metric.metric_state.items()},
            "update_count": int(metric.update_count),
        }
        for name, metric in _metrics(module).items()
    }


def put_back_metric_states(module: torch.nn.Module, states: dict[str, dict[str, Any]]) -> None:
    """Give the module's metrics what :func:`metric_states` returned (metrics not found are skipped)."""
    for name, metric in _metrics(module).items():
        saved = states.get(name)
        if saved is None:
            continue
        device = metric.device
        for key, value in saved["state"].items():
            if key in metric.metric_state:
                setattr(metric, key, _to(value, device))
        set_update_count(metric, saved["update_count"])


def capture(trainer: pl.Trainer, module_states: dict[str, dict[str, Any]] | None = None) -> EpochMetrics:
    """This rank's metric states (or ``module_states``, taken earlier), accumulators and callback metrics."""
    module = trainer.lightning_module
    return {
        "module": metric_states(module) if module_states is None else module_states,
        "logged": epoch_accumulators(trainer),
        "callback": {k: _copy(v) for k, v in callback_metrics(trainer).items()},
    }


def restore(trainer: pl.Trainer, saved: EpochMetrics | None, mid_epoch: bool) -> None:
    """Put back what :func:`capture` returned; the epoch's accumulators only ``mid_epoch`` (between
    epochs Lightning has logged and reset them)."""
    if not saved:
        return
    device = trainer.strategy.root_device
    put_back_callback_metrics(trainer, {k: _to(v, device) for k, v in saved.get("callback", {}).items()})
    put_back_metric_states(trainer.lightning_module, saved.get("module", {}))
    if mid_epoch:
        put_back_epoch_accumulators(trainer, saved.get("logged", []))
