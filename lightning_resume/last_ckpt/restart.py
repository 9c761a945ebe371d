"""The restart rule, for ``RequeueCheckpoint`` and ``lightning-resume inspect`` (pure standard library);
a test checks that ``docs/src/how_resume_works.md`` states :data:`RULES`."""

from __future__ import annotations

import enum
from pathlib import Path

from lightning_resume.run_dir import layout, save_record


class Restart(enum.Enum):
    """What a restart of a run does (:attr:`rule` says when)."""

    RESUME = "resume"
    START_OVER = "start over"
    LOST = "lost"

    @property
    def rule(self) -> str:
        """The rule in one sentence, as the docs state it."""
        return RULES[self]


RULES = {
    Restart.RESUME: (
        "A committed copy of `last.ckpt` exists (in the checkpoint folder, in a node's memory tier or on "
        "the mirror): the restart resumes from the newest one."
    ),
    Restart.START_OVER: (
        "No copy of `last.ckpt` anywhere and the run never committed a checkpoint: the restart starts from "
        "the beginning in the same run dir."
    ),
    Restart.LOST: (
        "No copy of `last.ckpt` anywhere although the run committed one (`saves.json` in the run dir "
        "says so): the restart raises `ResumeError` instead of starting over."
    ),
}


def exists(last: Path) -> bool:
    """Whether ``last.ckpt`` exists: a file or a directory (sharded), or a link to one (not dangling)."""
    return last.is_file() or last.is_dir()


def decide(run_dir: Path, last: Path | None = None, elsewhere: str | None = None) -> Restart:
    """Apply the restart rule to ``run_dir`` (whose ``last.ckpt`` is ``last``, by default in the run dir;
    ``elsewhere``: where another tier holds a committed copy of it, if one does)."""
    if exists(last or layout.last_checkpoint(run_dir)) or elsewhere:
        return Restart.RESUME
    if save_record.read(run_dir).committed:
        return Restart.LOST
    return Restart.START_OVER


def record_saved(run_dir: Path) -> None:
    """Record in ``saves.json`` that the run committed a checkpoint (known even if the folder is lost)."""
    save_record.update(run_dir, committed=True)


def outlook(run_dir: Path, last: Path, copy: str | None = None) -> str:
    """What a restart of ``run_dir`` will do, by the rule as it stands now (for the line ending ``fit``)."""
    restart = decide(run_dir, last, copy)
    if restart is Restart.RESUME:
        if exists(last):
            return f"{last} keeps its last save: a restart resumes from it"
        return f"a restart resumes from {copy} ({last} is missing)"
    if restart is Restart.START_OVER:
        return f"no checkpoint was saved yet, so a restart starts over (nothing at {last})"
    return (
        f"{last} is missing although the run saved checkpoints, so a restart raises ResumeError until "
        "last.ckpt is restored from a copy"
    )
