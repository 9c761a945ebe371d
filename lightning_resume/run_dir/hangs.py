"""What a hung rank leaves in the run dir: ``hangs/attempt-<N>-rank-<R>.txt`` (stacks) and ``.json`` (a note).
Pure standard library, safe on a watchdog thread (no logging, no lock the main thread may hold)."""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import atomic_open, write_json_atomic
from lightning_resume.run_dir import layout


class Section(str, enum.Enum):
    """Where a rank is; each section has its own timeout."""

    #: From the callback's construction to the end of the first training step (DDP set-up, data,
    #: compilation), less the checkpoint load and the sanity check.
    STARTUP = "startup"
    STEP = "step"  # one training step, with fetching its batch
    VALIDATION = "validation"  # one validation batch (the sanity check's too)
    EPOCH_END = "epoch_end"  # from an epoch's last step to the next's first (hooks, new iterators)
    SAVE = "save"  # a checkpoint save, until training goes on (a wait until durable included)
    LOAD = "load"  # loading the checkpoint a restart resumes from
    TEARDOWN = "teardown"  # the final save's wait, teardown hooks; after an error, Lightning's clean-up

    @property
    def label(self) -> str:
        """The section as people read it (``"training step"``)."""
        return LABELS[self.value]


LABELS = {
    "startup": "start-up",
    "step": "training step",
    "validation": "validation",
    "epoch_end": "epoch end",
    "save": "checkpoint save",
    "load": "checkpoint load",
    "teardown": "teardown",
}


def section_label(value: str | None) -> str:
    """A section value (``"step"``) as people read it; unknown values as they are."""
    return LABELS.get(value or "", value or "unknown section")


_NAME = re.compile(r"^attempt-(\d+)-rank-(\d+)\.(json|txt)$")


@dataclass(frozen=True)
class HangNote:
    """One rank's report of a hang."""

    attempt: int  # see ``attempts.json``
    rank: int  # global rank
    section: str  # a ``Section`` value: where the rank was
    step: int | None  # the global step it had reached (``None`` before training)
    seconds: float  # how long it had made no progress
    timeout: float  # the section's timeout it exceeded
    time: float  # when it reported (seconds since the epoch)
    host: str
    pid: int
    stacks: str  # its stacks file, relative to the run dir

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HangNote:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def stacks_path(run_dir: Path, attempt: int, rank: int) -> Path:
    return layout.hangs_dir(run_dir) / f"attempt-{attempt}-rank-{rank}.txt"


def write_stacks(path: Path, header: str) -> None:
    """Write ``header`` and every thread's Python stack (this process) to ``path``, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w") as handle:
        handle.write(header.rstrip("\n") + "\n\n")
        handle.flush()  # faulthandler writes to the descriptor, after what is buffered here
        faulthandler.dump_traceback(file=handle, all_threads=True)


def write_note(run_dir: Path, note: HangNote) -> Path:
    """Record ``note`` as ``hangs/attempt-<N>-rank-<R>.json``; return the path."""
    path = stacks_path(run_dir, note.attempt, note.rank).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, note.to_dict())
    return path


def _files(run_dir: Path) -> list[tuple[Path, int, int, str]]:
    """The run dir's hang files: each one's path, attempt, rank and suffix."""
    folder = layout.hangs_dir(run_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    matches = (_NAME.match(name) for name in names)
    return [(folder / m[0], int(m[1]), int(m[2]), m[3]) for m in matches if m]


def read_notes(run_dir: Path) -> list[HangNote]:
    """Every readable hang note of the run dir, oldest first (unreadable ones are skipped)."""
    notes = []
    for path, _, _, suffix in _files(run_dir):
        if suffix != "json":
            continue
        try:
            notes.append(HangNote.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a note being replaced, or not ours: the others still tell the story
    return sorted(notes, key=lambda n: (n.time, n.rank))


def reported_ranks(run_dir: Path, attempt: int) -> set[int]:
    return {rank for _, number, rank, suffix in _files(run_dir) if number == attempt and suffix == "json"}


def prune(run_dir: Path, keep: set[int]) -> None:
    """Remove the hang files of attempts not in ``keep`` (the history keeps a bounded number)."""
    for path, number, _, _ in _files(run_dir):
        if number not in keep:
            with contextlib.suppress(OSError):
                path.unlink()
