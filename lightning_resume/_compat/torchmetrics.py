"""Every touch of torchmetrics' internals, pinned by ``tests/_compat/test_torchmetrics.py``."""

from __future__ import annotations

from typing import Any


def set_update_count(metric: Any, count: int) -> None:
    """Give a ``torchmetrics.Metric`` the number of updates it had (no public setter; ``compute()`` warns
    at 0) and drop its cached result, which must not survive the states put back."""
    metric._update_count = int(count)
    metric._computed = None
