"""Where TensorBoard and CSV logs of a version dir stand (a *position*: each event file's length, the rows
of ``metrics.csv``), and cutting them back to one: a restart logs again what followed its checkpoint."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import (
    fsync_dir,
    fsync_file,
    replace_durably,
    write_json_atomic,
    write_text_atomic,
)

METRICS = "metrics.csv"
#: What ``CSVLogger`` writes its hyperparameters to.
HPARAMS = "hparams.yaml"
#: ``metrics.csv`` of the interrupted attempt, set aside until the restart cuts it.
KEPT = ".metrics.csv.resume"
#: ``<run dir>/logs/<CUTS>``: the position at the first resume point after each recent save.
CUTS = ".positions.json"
_EVENTS = "events.out.tfevents."
_RECENT = 16  # saves whose positions are kept (a restart loads the newest committed one)
_HEADER = struct.Struct("<QI")  # a TFRecord: length, its crc; then the data and the data's crc


def event_files(log_dir: Path) -> dict[str, int]:
    """Every TensorBoard event file under ``log_dir`` (path relative to it) and its length."""
    found = {}
    for path in sorted(log_dir.rglob(f"{_EVENTS}*")):
        with contextlib.suppress(OSError):
            if path.is_file():
                found[str(path.relative_to(log_dir))] = path.stat().st_size
    return found


def whole_records(path: Path, limit: float = math.inf) -> int:
    """The length of the whole TFRecords (a kill may leave half of one) starting ``path``, up to ``limit``."""
    size = min(path.stat().st_size, limit)
    end = 0
    with open(path, "rb") as f:
        while end + _HEADER.size <= size:
            f.seek(end)
            length, _ = _HEADER.unpack(f.read(_HEADER.size))
            if end + _HEADER.size + length + 4 > size:
                break
            end += _HEADER.size + length + 4
    return end


def cut_events(log_dir: Path, keep: Mapping[str, float]) -> None:
    """Cut each event file named in ``keep`` to its whole records within that length; remove the others."""
    for name in event_files(log_dir):
        path = log_dir / name
        if name not in keep:
            path.unlink()
        elif (length := whole_records(path, keep[name])) < path.stat().st_size:
            os.truncate(path, length)
            fsync_file(path)
        fsync_dir(path.parent)


def set_aside_metrics(log_dir: Path) -> bool:
    """Move ``metrics.csv`` aside (``CSVLogger`` deletes it before any hook); whether rows are kept for the
    restart. A kept file there already is a dead restart's, which had not cut it yet: it stays."""
    current, kept = log_dir / METRICS, log_dir / KEPT
    if kept.is_file():
        if current.is_file():
            current.unlink()
            fsync_dir(log_dir)
    elif current.is_file():
        replace_durably(current, kept)
    return kept.is_file()


def put_back_metrics(log_dir: Path) -> None:
    """Undo :func:`set_aside_metrics` (the logger does not continue in ``log_dir`` after all)."""
    current, kept = log_dir / METRICS, log_dir / KEPT
    if kept.is_file() and not current.exists():
        replace_durably(kept, current)


def count_rows(path: Path) -> int:
    """The whole rows of a CSV written by ``CSVLogger`` (numbers only: one line per row)."""
    try:
        with open(path, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
    return max(lines - 1, 0)


def _rows(path: Path, limit: float = math.inf) -> list[dict[str, str]]:
    """The first ``limit`` whole rows of a CSV, empty fields left out (none for a missing file)."""
    try:
        with open(path, newline="") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    text = text[: text.rfind("\n") + 1]  # a last row cut short by a kill
    rows: list[dict[str, str]] = []
    for row in csv.DictReader(io.StringIO(text, newline="")):
        if len(rows) >= limit:
            break
        if None not in row and None not in row.values():
            rows.append({k: v for k, v in row.items() if v != ""})
    return rows


def cut_metrics(log_dir: Path, rows: float, own: bool) -> list[str]:
    """Make ``metrics.csv`` the kept file's first ``rows`` rows, then (``own``) this attempt's; return the
    header (the columns with a value, sorted as ``CSVLogger`` does) the logger's writer must use now."""
    kept, current = log_dir / KEPT, log_dir / METRICS
    merged = _rows(kept, rows) + (_rows(current) if own else [])
    header = sorted({key for row in merged for key in row})
    if merged:
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, fieldnames=header)
        writer.writeheader()
        writer.writerows(merged)
        write_text_atomic(current, out.getvalue())
    else:
        current.unlink(missing_ok=True)
    kept.unlink(missing_ok=True)
    fsync_dir(log_dir)
    return header


def read_cuts(path: Path) -> dict[str, Any]:
    """Save token -> the position at the first resume point after that save (``{}``: none recorded)."""
    try:
        entries = json.loads(path.read_text()).get("saves", [])
        return {entry["token"]: entry["position"] for entry in entries}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return {}


def record_cuts(path: Path, tokens: list[str], position: dict[str, Any]) -> None:
    """Record ``position`` for the saves ``tokens`` (atomically; the most recent saves only)."""
    known = read_cuts(path)
    known.update(dict.fromkeys(tokens, position))
    recent = list(known.items())[-_RECENT:]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"saves": [{"token": t, "position": p} for t, p in recent]})


def remove_new_log_dir(log_dir: Path, written_here: tuple[str, ...] = ()) -> bool:
    """Remove a version dir this process just made: empty, or only its event files and ``written_here``."""
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
