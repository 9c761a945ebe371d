"""What an epoch logs at its end and callbacks read, in no state_dict: ``torchmetrics.Metric`` states, what
``self.log(..., on_epoch=True)`` summed so far, and ``trainer.callback_metrics``; saved and put back."""

from __future__ import annotations

from typing import Any, TypedDict

import lightning.pytorch as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_resume._compat.lightning import (
    callback_metrics,
    epoch_accumulators,
    put_back_callback_metrics,
    put_back_epoch_accumulators,
)
from lightning_resume._compat.torchmetrics import set_update_count
from lightning_resume.exact_resume.per_rank_states import cpu_copy


class EpochMetrics(TypedDict):
    """One rank's metric states (``module``), epoch accumulators (``logged``), callback metrics."""

    module: dict[str, dict[str, Any]]
    logged: list[dict[str, Any]]
    callback: dict[str, torch.Tensor]


def _metrics(module: torch.nn.Module) -> dict[str, Any]:
    try:
        from torchmetrics import Metric
    except ImportError:  # torchmetrics is optional
        return {}
    return {name: m for name, m in module.named_modules() if isinstance(m, Metric)}


def metric_states(module: torch.nn.Module) -> dict[str, dict[str, Any]]:
    return {
        name: {"state": cpu_copy(dict(metric.metric_state)), "update_count": int(metric.update_count)}
        for name, metric in _metrics(module).items()
    }


def put_back_metric_states(module: torch.nn.Module, states: dict[str, dict[str, Any]]) -> None:
    """Give the module's metrics what :func:`metric_states` returned (metrics not found are skipped)."""
    for name, metric in _metrics(module).items():
        saved = states.get(name)
        if saved is None:
            continue
        for key, value in saved["state"].items():
            if key in metric.metric_state:
                setattr(metric, key, apply_to_collection(value, torch.Tensor, torch.Tensor.to, metric.device))
        set_update_count(metric, saved["update_count"])


def capture(trainer: pl.Trainer, module_states: dict[str, dict[str, Any]] | None = None) -> EpochMetrics:
    """This rank's metric states (or ``module_states``, taken earlier), accumulators and callback metrics."""
    module = trainer.lightning_module
    return {
        "module": metric_states(module) if module_states is None else module_states,
        "logged": epoch_accumulators(trainer),
        "callback": cpu_copy(callback_metrics(trainer)),
    }


def restore(trainer: pl.Trainer, saved: EpochMetrics | None, mid_epoch: bool) -> None:
    """Put back what :func:`capture` returned; the accumulators only ``mid_epoch`` (else logged and reset)."""
    if not saved:
        return
    device = trainer.strategy.root_device
    callback = apply_to_collection(saved.get("callback", {}), torch.Tensor, torch.Tensor.to, device)
    put_back_callback_metrics(trainer, callback)
    put_back_metric_states(trainer.lightning_module, saved.get("module", {}))
    if mid_epoch:
        put_back_epoch_accumulators(trainer, saved.get("logged", []))
