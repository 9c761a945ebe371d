"""The commit step: commit, remove and prune the checkpoints of a local folder (both kinds), and clean the
leftovers of interrupted saves. A commit puts the manifest of a version written aside (and fsynced) in
place and swaps it in with one rename: a kill at any instant leaves the old version or the new one, each
matching its manifest. Leftovers carry the pid of their writer in their name (``.lr-tmp-<pid>-...``,
``.lr-save-<pid>-<hex>``) and are removed once that process is gone (by a restart, all: the earlier
attempt may have run on another host)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir, replace_durably, write_text_atomic
from lightning_resume._storage.catalog import retention
from lightning_resume._storage.direct_file import Aside
from lightning_resume._storage.kinds import FILE, Kind, Step, unobserved
from lightning_resume._storage.manifest import (
    MANIFEST_SUFFIX,
    Entry,
    R,
    encode,
    manifest_path,
    next_entries,
    read_entries,
    sized,
)
from lightning_resume._storage.store import SAVE_PREFIX, LocalStore, Store

#: The steps of a commit, in order, as passed to its ``on_step`` observer (``mid_delete``: pruning).
COMMIT_STEPS = ("before_manifest", "before_rename", "before_swap", "after_swap", "mid_delete")
#: A leftover of an interrupted save, with the pid of the process that wrote it.
_LEFTOVER = re.compile(rf"^(?:{re.escape(TEMP_PREFIX)}|{re.escape(SAVE_PREFIX)})(\d+)-")

_HINTS = {
    errno.ENOSPC: "free space on that filesystem, or keep fewer checkpoints (keep=..., save_top_k=...)",
    errno.EDQUOT: "free space within your quota, or keep fewer checkpoints (keep=..., save_top_k=...)",
    errno.EFBIG: "the file exceeds a file-size limit of this process or filesystem (ulimit -f)",
    errno.EACCES: "make the checkpoint directory writable by the user running training",
    errno.EPERM: "make the checkpoint directory writable by the user running training",
    errno.EROFS: "save checkpoints to a writable filesystem",
}


def save_error(err: int | None, strerror: str, filename: str | None, path: str | Path) -> OSError:
    """An ``OSError`` (of the subclass ``err`` maps to) that says which save failed and what to do."""
    hint = _HINTS.get(err or 0, "check the checkpoint directory and the filesystem it is on")
    message = f"Could not save checkpoint {str(path)!r}: {strerror}. The previous checkpoint is intact; "
    return OSError(err, message + hint, filename) if err is not None else OSError(message + hint)


def commit(
    kind: Kind[R],
    staged: Path,
    target: Path,
    records: Sequence[R],
    name: str | None = None,
    on_step: Step = unobserved,
) -> Path:
    """Make ``staged`` (fsynced) what ``target`` names, with the manifest ``records``, as ``name`` (default:
    from its step); return where it is now. On an ``OSError``, ``target`` is as it was."""
    try:
        on_step("before_manifest")
        write_text_atomic(kind.manifest_at(staged, target), kind.encode(records))
        on_step("before_rename")
        final = kind.swap(staged, target, records[0], name, on_step)
    except BaseException:
        LocalStore(staged.parent).remove(staged.name, tree=kind.directory)
        raise
    on_step("after_swap")
    return final


def commit_file(
    aside: Aside, record: Entry | Mapping[str, Any], known: Entry | None = None, keep: int | None = None
) -> tuple[Entry, list[str]]:
    """The commit step of a file save: put the version ``aside`` wrote in place as its target, with the
    manifest entry ``record`` (the fields of a new one; or a copy's ``Entry``, which its bytes must match:
    ``OSError`` otherwise), keeping the previous entry (``known``: the caller committed it, so the
    manifest is not read); then, with ``keep``, retention. Return the entry and the names retention
    removed; on an ``OSError`` the target is as it was."""
    target = aside.target
    assert aside.path is not None, "commit_file after the with block of the Aside"
    try:
        if isinstance(record, Entry) and (aside.size, aside.checksum) != (record.size, record.checksum):
            raise OSError(
                errno.EIO,
                f"{aside.size} bytes with checksum {aside.checksum} were written for {str(target)!r}, "
                f"expected {record.size} / {record.checksum}: not committed",
            )
        entry = (
            record
            if isinstance(record, Entry)
            else Entry.from_json({**record, "size": aside.size, "checksum": aside.checksum})
        )
        current = [known] if known is not None else held(target)
        # The manifest first: whichever data file a kill leaves matches one of its entries.
        write_text_atomic(manifest_path(target), encode(next_entries(entry, current)))
        replace_durably(aside.path, target)
    except BaseException:
        aside.discard()
        raise
    return entry, prune(LocalStore(target.parent), FILE, keep) if keep is not None else []


def held(path: Path) -> list[Entry]:
    """The versions the manifest of the file ``path`` lists that its size matches (none without it)."""
    try:
        size = path.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sized(read_entries(path) or [], size)


def remove(store: Store, kind: Kind[R], name: str, on_step: Step = unobserved) -> None:
    """Delete checkpoint ``name``: first what would let a half-deleted one count."""
    for index, (part, folder) in enumerate(kind.removal(name)):
        if index:
            on_step("mid_delete")
        store.remove(part, tree=folder)


def prune(
    store: Store, kind: Kind[R], keep: int | None, current: str | None = None, on_step: Step = unobserved
) -> list[str]:
    """Remove what ``catalog.retention`` names (never ``current``); return the names."""
    doomed = retention(store, kind, keep, current)
    for name in doomed:
        remove(store, kind, name, on_step)
    return doomed


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
