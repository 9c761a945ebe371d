"""Every touch of swanlab's internals, pinned by ``tests/trackers/test_swanlab_resume.py``."""

from __future__ import annotations

from typing import Any


def swanlab_place(run: Any) -> tuple[str | None, str | None]:
    """``(project, workspace)`` of a SwanLab run, from its settings (public only online, as ``run.path``)."""
    settings = getattr(getattr(getattr(run, "_ctx", None), "config", None), "settings", None)
    project = getattr(settings, "project", None)
    return getattr(project, "name", None), getattr(project, "workspace", None)
