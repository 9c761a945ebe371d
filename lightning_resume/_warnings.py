"""The one channel for warnings to the user: :class:`~lightning_resume.exceptions.LightningResumeWarning`,
for what to change or know before trusting the result (events that need no action are logged)."""

from __future__ import annotations

import warnings

from lightning_resume.exceptions import LightningResumeWarning


def warn(message: str, *, all_ranks: bool = False, stacklevel: int = 2) -> None:
    """Warn with a :class:`LightningResumeWarning` on global rank 0, on every rank with ``all_ranks`` (a
    message about this process); ``stacklevel`` as for ``warnings.warn``, counted from the caller."""
    if all_ranks:
        warnings.warn(message, LightningResumeWarning, stacklevel=stacklevel + 1)
    else:
        # Imported here: the torch-free modules (run-dir resolution) warn through this channel too.
        from lightning.fabric.utilities.rank_zero import rank_zero_warn

        rank_zero_warn(message, category=LightningResumeWarning, stacklevel=stacklevel + 4)
