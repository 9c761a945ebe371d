"""Pins of ``lightning_resume._compat.torchmetrics`` against the installed torchmetrics."""

from __future__ import annotations

import warnings

import pytest
import torch
from torchmetrics import MeanMetric

from lightning_resume._compat.torchmetrics import set_update_count

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared


def test_the_update_count_decides_whether_compute_warns_and_the_cache_is_dropped() -> None:
    metric = MeanMetric()
    metric.update(torch.tensor(2.0))
    assert float(metric.compute()) == 2.0  # cached now
    metric.mean_value = torch.tensor(9.0)
    metric.weight = torch.tensor(3.0)
    set_update_count(metric, 3)
    assert metric.update_count == 3
    assert float(metric.compute()) == 3.0  # not the cached 2.0
    fresh = MeanMetric()
    set_update_count(fresh, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "compute was called before update" would be raised
        fresh.compute()
