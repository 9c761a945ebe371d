"""``status.json``: how the latest attempt of a run stands (what ``inspect`` and ``gc`` read)."""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.run_dir import layout


class RunStatus(str, enum.Enum):
    """The states a run's latest attempt records."""

    RUNNING = "running"
    FINISHED = "finished"
    PREEMPTED = "preempted"
    FAILED = "failed"
    #: ``ProgressWatchdog`` found a rank without progress and ended the attempt.
    HUNG = "hung"
    #: ``ProgressWatchdog`` stopped a run whose attempts keep ending without a new checkpoint.
    CRASH_LOOP = "crash-loop"
    #: Nothing readable was recorded.
    UNKNOWN = "unknown"


def write_status(
    run_dir: Path,
    status: RunStatus,
    step: int | None,
    detail: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Record ``status`` at ``step`` (atomically), with this process's id and the time.

    ``extra`` adds fields (a hang's ``{"hang": {...}}``); it cannot replace the standard ones.
    """
    record: dict[str, Any] = {**(extra or {})}
    record |= {
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
