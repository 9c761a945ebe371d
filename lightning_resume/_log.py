"""Our INFO lines where Lightning's appear: a handler on our logger that prints only while neither the root
logger nor ours has a handler of the user's; once they configure logging, it stays silent."""

from __future__ import annotations

import logging
import os

NAME = "lightning_resume"


def _global_rank() -> int:
    for variable in ("RANK", "SLURM_PROCID", "PMI_RANK"):
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return 0


class _UnlessConfigured(logging.StreamHandler):
    """Prints a record unless another handler would: INFO from global rank 0, warnings from all."""

    def emit(self, record: logging.LogRecord) -> None:
        ours = logging.getLogger(NAME)
        if logging.getLogger().handlers or any(h is not self for h in ours.handlers):
            return
        if record.levelno < logging.WARNING and _global_rank() != 0:
            return
        super().emit(record)


def show_info_lines() -> None:
    """Install the handler once (and INFO as the level, unless the user set one)."""
    logger = logging.getLogger(NAME)
    if any(isinstance(h, _UnlessConfigured) for h in logger.handlers):
        return
    logger.addHandler(_UnlessConfigured())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
