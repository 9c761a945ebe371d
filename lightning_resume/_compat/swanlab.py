"""Every touch of swanlab's internals, pinned by ``tests/trackers/test_swanlab_resume.py``."""

from __future__ import annotations

from typing import Any


def swanlab_place(run: Any) -> tuple[str | None, str | None]:
    """``(project, workspace)`` of a SwanLab run.

    swanlab 0.10 exposes a run's project and workspace publicly only in online mode (``run.path``);
    they live in the run's settings.
    """
    settings = getattr(getattr(getattr(run, "_ctx", None), "config", None), "settings", None)
    project = getattr(settings, "project", None)
    return getattr(project, "name", None), getattr(project, "workspace", None)
