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
    HUNG = "hung"  # ``ProgressWatchdog`` found a rank without progress and ended the attempt
    CRASH_LOOP = "crash-loop"  # ``ProgressWatchdog`` stopped attempts that keep ending without a checkpoint
    UNKNOWN = "unknown"  # nothing readable was recorded


def write_status(
    run_dir: Path,
    status: RunStatus,
    step: int | None,
    detail: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Record ``status`` at ``step`` atomically; ``extra`` adds fields, never replacing the standard ones."""
    record: dict[str, Any] = {
        **(extra or {}),
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
        data = None
    if not isinstance(data, dict) or "status" not in data:
        return {"status": RunStatus.UNKNOWN.value}
    return data
