"""``status.json``: how the latest attempt of a run stands (what ``inspect`` and ``gc`` read)."""

from __future__ import annotations

import enum
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from lightning_resume._run import layout
from lightning_resume._storage.atomic import write_json_atomic


class RunStatus(str, enum.Enum):
    """The states a run's latest attempt records."""

    RUNNING = "running"
    FINISHED = "finished"
    PREEMPTED = "preempted"
    FAILED = "failed"
    #: Nothing readable was recorded.
    UNKNOWN = "unknown"


def write_status(run_dir: Path, status: RunStatus, step: int, detail: str | None = None) -> None:
    """Record ``status`` at ``step`` (atomically), with this process's id and the time."""
    record: dict[str, Any] = {
        "status": status.value,
        "step": step,
        "time": datetime.now().isoformat(timespec="seconds"),
        "pid": os.getpid(),
    }
    if detail:
        record["detail"] = detail
    write_json_atomic(run_dir / layout.STATUS, record)


def read_status(run_dir: Path) -> dict[str, Any]:
    """The ``status.json`` of a run dir (``{"status": "unknown"}`` if missing or unreadable)."""
    try:
        data = json.loads((run_dir / layout.STATUS).read_text())
    except (OSError, ValueError):
        return {"status": RunStatus.UNKNOWN.value}
    if not isinstance(data, dict) or "status" not in data:
        return {"status": RunStatus.UNKNOWN.value}
    return data
