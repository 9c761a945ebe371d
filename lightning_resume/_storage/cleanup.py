"""Leftovers of interrupted saves, and removing them (pure standard library).

Names written aside carry their process id (``.lr-tmp-<pid>-...``, ``.lr-save-<pid>-<hex>``): a later
process removes those of processes that are gone; a restart, all (the earlier attempt may have run on
another host). A manifest without its data file (a removal cut short) goes too, unless a live process
is writing here: in a commit, the new manifest comes first.
"""

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
    """Whether process ``pid`` exists (this one, or another this user may or may not signal)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale(folder: Path, restart: bool = False) -> list[str]:
    """Names written aside by processes that are gone (by any process, when ``restart``), sorted."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _LEFTOVER.match(name)
        if match and (restart or not process_alive(int(match.group(1)))):
            found.append(name)
    return sorted(found)


def clean_stale(folder: str | Path, restart: bool = False) -> list[str]:
    """Delete the :func:`stale` leftovers, then manifests whose data file is gone; return the names.

    Manifests are left alone while a live process has something written aside here.
    """
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
