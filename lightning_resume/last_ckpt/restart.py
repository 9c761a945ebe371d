"""The restart rule, from the checkpoint directory alone: one function for ``RequeueCheckpoint`` and
``lightning-resume inspect``; a test checks that ``docs/src/how_resume_works.md`` states :data:`RULES`.
Pure standard library.
"""

from __future__ import annotations

import enum
from pathlib import Path

from lightning_resume._storage.atomic import create_text_exclusive
from lightning_resume.run_dir import layout


class Restart(enum.Enum):
    """What a restart of a run does."""

    #: ``last.ckpt`` exists: the restart resumes from it.
    RESUME = "resume"
    #: No ``last.ckpt`` and the run never committed a checkpoint: it starts from the beginning, in the
    #: same run dir (the earlier attempt stopped before its first save; nothing is lost).
    START_OVER = "start over"
    #: No ``last.ckpt`` although the run committed one: the restart raises ``ResumeError`` rather
    #: than silently discard the run.
    LOST = "lost"

    @property
    def rule(self) -> str:
        """The rule in one sentence, as the docs state it."""
        return RULES[self]


RULES = {
    Restart.RESUME: "`last.ckpt` exists: the restart resumes from it.",
    Restart.START_OVER: (
        "No `last.ckpt` and the run never committed a checkpoint: the restart starts from the beginning "
        "in the same run dir."
    ),
    Restart.LOST: (
        "No `last.ckpt` although the run committed one: the restart raises `ResumeError` instead of "
        "starting over."
    ),
}


def exists(last: Path) -> bool:
    """Whether ``last.ckpt`` exists: a file or a directory (sharded), or a link to one (not dangling)."""
    return last.is_file() or last.is_dir()


def decide(run_dir: Path, last: Path | None = None) -> Restart:
    """Apply the restart rule to ``run_dir`` (whose ``last.ckpt`` is ``last``, by default in the run dir)."""
    if exists(last or layout.last_checkpoint(run_dir)):
        return Restart.RESUME
    if layout.saved_marker(run_dir).exists():
        return Restart.LOST
    return Restart.START_OVER


def record_saved(run_dir: Path) -> None:
    """Mark that the run has committed a checkpoint (``checkpoints/.saved``, kept): in the run dir even
    when ``last.ckpt`` is node-local, so that a restart on another node knows."""
    marker = layout.saved_marker(run_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    create_text_exclusive(marker, "")
