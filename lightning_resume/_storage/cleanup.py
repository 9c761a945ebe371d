"""Leftovers of interrupted saves: names written aside carry their pid (``.lr-tmp-<pid>-...``,
``.lr-save-<pid>-<hex>``), removed once that process is gone (by a restart, all: the earlier attempt may
have run on another host)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir
from lightning_resume._storage.manifest import MANIFEST_SUFFIX
from lightning_resume._storage.store import SAVE_PREFIX, LocalStore

_LEFTOVER = re.compile(rf"^(?:{re.escape(TEMP_PREFIX)}|{re.escape(SAVE_PREFIX)})(\d+)-")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def stale(folder: Path, restart: bool = False) -> list[str]:
    """Names written aside by processes that are gone (by any process, when ``restart``), sorted."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    matches = [(name, _LEFTOVER.match(name)) for name in names]
    return sorted(n for n, m in matches if m and (restart or not process_alive(int(m.group(1)))))


def clean_stale(folder: str | Path, restart: bool = False) -> list[str]:
    """Delete the :func:`stale` leftovers, then manifests whose data file is gone (a removal cut short;
    not while a live process writes here: a commit puts the new manifest first); return the names."""
    folder = Path(folder)
    removed = stale(folder, restart)
    for name in removed:
        LocalStore(folder).remove(name, tree=(folder / name).is_dir() and not (folder / name).is_symlink())
    try:
        names = set(os.listdir(folder))
    except FileNotFoundError:
        return removed
    if not any(_LEFTOVER.match(n) for n in names):
        for name in sorted(names):
            if name.endswith(MANIFEST_SUFFIX) and name[: -len(MANIFEST_SUFFIX)] not in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)
                    removed.append(name)
    if removed:
        fsync_dir(folder)
    return removed
