"""TensorBoard and CSV logs of a restart that resumes at logging step ``k``: what the interrupted
attempt logged at steps ``>= k`` is dropped, so that every step appears once.

- TensorBoard: a ``SessionLog(START)`` at step ``k`` (as ``SummaryWriter(purge_step=k)``) makes readers
  drop earlier events at steps ``>= k``; the server ignores a run's first START, so one goes at step 0.
- CSV: ``CSVLogger`` deletes ``metrics.csv`` before any callback hook, so a restart moves it aside
  (:data:`KEPT`) before ``fit`` and writes back the rows at steps ``< k``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import socket
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import fsync_dir, replace_durably, write_text_atomic

METRICS = "metrics.csv"
#: What ``CSVLogger`` writes its hyperparameters to.
HPARAMS = "hparams.yaml"
#: ``metrics.csv`` of the interrupted attempt, set aside until the restart knows its resumed step.
KEPT = ".metrics.csv.resume"
_EVENTS = "events.out.tfevents."


def set_aside_metrics(log_dir: Path) -> bool:
    """Move ``metrics.csv`` out of ``CSVLogger``'s way (over an older kept file); return whether rows are
    kept for the restart."""
    current, kept = log_dir / METRICS, log_dir / KEPT
    if current.is_file():
        replace_durably(current, kept)
    return kept.is_file()


def put_back_metrics(log_dir: Path) -> None:
    """Undo :func:`set_aside_metrics` (the logger does not continue in ``log_dir`` after all)."""
    current, kept = log_dir / METRICS, log_dir / KEPT
    if kept.is_file() and not current.exists():
        replace_durably(kept, current)


def _step(row: dict[str, Any]) -> int | None:
    try:
        return int(float(row.get("step") or ""))
    except ValueError:
        return None


def _rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and whole rows of a CSV: a row cut short by a kill (fewer fields, no newline) is dropped."""
    text = ""
    if path.is_file():
        with open(path, newline="") as f:
            text = f.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # the last row was being written
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = list(reader.fieldnames or [])
    rows = [row for row in reader if None not in row.values() and None not in row]
    return header, rows


def merge_kept_rows(log_dir: Path, resume_step: float = math.inf) -> list[str]:
    """Write the kept rows at steps ``< resume_step``, then this attempt's, as ``metrics.csv`` (atomically),
    and remove the kept file. Returns the header, both files' columns, which the writer must use."""
    kept = log_dir / KEPT
    old_header, old_rows = _rows(kept)
    new_header, new_rows = _rows(log_dir / METRICS)
    header = sorted(set(old_header) | set(new_header))
    rows = [row for row in old_rows if (step := _step(row)) is not None and step < resume_step]
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=header)
    writer.writeheader()
    writer.writerows([*rows, *new_rows])
    write_text_atomic(log_dir / METRICS, out.getvalue())
    kept.unlink()
    fsync_dir(log_dir)
    return header


def remove_new_log_dir(log_dir: Path, written_here: tuple[str, ...] = ()) -> bool:
    """Remove a version dir that this process just made: empty, or only its own event files and
    ``written_here``."""
    if not log_dir.is_dir():
        return False
    mine = f".{socket.gethostname()}.{os.getpid()}."
    entries = list(log_dir.iterdir())
    if any(
        not (p.is_file() and (p.name in written_here or (p.name.startswith(_EVENTS) and mine in p.name)))
        for p in entries
    ):
        return False
    for p in entries:
        p.unlink()
    with contextlib.suppress(OSError):
        log_dir.rmdir()
    return not log_dir.exists()


def has_other_events(log_dir: Path) -> bool:
    """Whether ``log_dir`` holds event files of another process (an earlier run logged here)."""
    mine = f".{socket.gethostname()}.{os.getpid()}."
    return any(mine not in p.name for p in log_dir.glob(f"{_EVENTS}*"))


def write_purge_event(writer: Any, step: int) -> None:
    """Append the ``SessionLog(START)`` of ``SummaryWriter(purge_step=step)`` (torch's or tensorboardX's)."""
    if type(writer).__module__.startswith("tensorboardX"):
        from tensorboardX.proto.event_pb2 import Event, SessionLog
    else:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
    writer.flush()
