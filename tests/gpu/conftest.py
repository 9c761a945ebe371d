"""GPU checks: every case marked ``gpu`` is skipped when no CUDA device is present; ``make test-gpu`` runs
this folder on a machine with one.

Each check is parametrised by device: the ``cpu`` cases run in the normal suite (the cheap ones; the
others are ``slow``), so that the code the GPU cases run cannot rot on machines without a GPU.
"""

from __future__ import annotations

import pytest
import torch


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run `make test-gpu` on a machine with one)")
