"""The torchmetrics state a checkpoint carries: taken from one module, put back into another.

Pins the torchmetrics attributes ``put_back_metric_states`` sets (``_update_count``, ``_computed``):
there is no public setter for either.
"""

from __future__ import annotations

import warnings

import torch
import torchmetrics

from lightning_resume.exact_resume.epoch_metrics import metric_states, put_back_metric_states


class WithMetrics(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = torchmetrics.MeanMetric()
        self.inner = torch.nn.ModuleDict({"mse": torchmetrics.MeanSquaredError()})


def test_metric_states_go_back_into_another_module_and_compute_the_same() -> None:
    first = WithMetrics()
    first.mean.update(torch.tensor([1.0, 2.0]))
    first.inner["mse"].update(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))
    saved = metric_states(first)
    assert set(saved) == {"mean", "inner.mse"}
    assert saved["mean"]["update_count"] == 1

    second = WithMetrics()
    put_back_metric_states(second, saved)
    second.mean.update(torch.tensor([6.0]))
    first.mean.update(torch.tensor([6.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "compute called before update" must not fire
        assert torch.equal(second.mean.compute(), first.mean.compute())
        assert torch.equal(second.inner["mse"].compute(), first.inner["mse"].compute())
    assert second.mean.update_count == first.mean.update_count == 2


def test_a_cached_value_does_not_survive_the_put_back() -> None:
    module = WithMetrics()
    module.mean.update(torch.tensor([1.0]))
    assert module.mean.compute() == 1.0  # cached now
    other = WithMetrics()
    other.mean.update(torch.tensor([3.0]))
    put_back_metric_states(module, metric_states(other))
    assert module.mean.compute() == 3.0
