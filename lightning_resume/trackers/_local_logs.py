"""TensorBoard and CSV logs of a restarted run: functions over their files.

A restarted attempt resumes at logging step ``k``; the interrupted attempt may have logged steps
``>= k`` after its last checkpoint. They are dropped so that every step appears once:

- TensorBoard: a ``SessionLog(START)`` event at step ``k`` (what ``SummaryWriter(purge_step=k)``
  writes) makes TensorBoard's readers drop the earlier events at steps ``>= k``; the files keep them.
  TensorBoard's server ignores the *first* START of a run, so a fresh run writes one at step 0.
- CSV: ``CSVLogger`` deletes ``metrics.csv`` when it creates its writer in a non-empty dir, before any
  callback hook. A restart therefore moves it aside (:data:`KEPT`) as soon as the run dir is known,
  before ``fit``, and writes back the rows at steps ``< k`` once ``k`` is known.
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
    """Move ``metrics.csv`` out of ``CSVLogger``'s way; return whether rows are kept for the restart.

    A ``metrics.csv`` next to an older kept file is newer (the kept rows were merged into it before
    it was written), so it replaces the kept file. A kept file alone is an earlier restart that died
    before merging: it stays.
    """
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
    """Write the kept rows at steps ``< resume_step``, then this attempt's rows, as ``metrics.csv``.

    Written atomically; the kept file is removed afterwards. Returns the header, the sorted union of
    both files' columns (what ``CSVLogger``'s writer must use from now on).
    """
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
    """Remove a version dir that this process just made: empty, or only its own file(s).

    torch's ``SummaryWriter`` names files ``events.out.tfevents.<time>.<host>.<pid>.<n>``; the caller
    names the other files this process wrote there (``hparams.yaml`` of hyperparameters logged before
    ``fit``). Anything else in the dir, or an event file of another process, keeps the dir.
    """
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
    """Append the ``SessionLog(START)`` event that ``SummaryWriter(purge_step=step)`` writes when created.

    ``writer`` is the ``SummaryWriter`` of torch (which uses ``tensorboard``'s protos) or of tensorboardX.
    """
    if type(writer).__module__.startswith("tensorboardX"):
        from tensorboardX.proto.event_pb2 import Event, SessionLog
    else:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
    writer.flush()
