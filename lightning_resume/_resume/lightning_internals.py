"""The one place that touches Lightning internals, for what Lightning offers no public route.

Pinned by ``tests/resume/test_lightning_internals.py``: when Lightning changes, that test fails loudly.
"""

from __future__ import annotations

import lightning.pytorch as pl


def restart_train_iterator(trainer: pl.Trainer) -> None:
    """Create the training iterator again, as ``FitLoop.setup_data`` did before ``on_train_start``.

    Lightning 2.6 creates the iterator before any hook that can change the loader's sampler; an
    exact mid-epoch resume of a plain ``DataLoader`` has to make it again after changing it.
    """
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None:
        raise RuntimeError("Lightning has no training data fetcher yet: call this from on_train_start.")
    iter(fetcher)
