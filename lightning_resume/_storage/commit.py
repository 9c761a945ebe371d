"""The commit step (the manifest, then one rename: a kill leaves the old version or the new), what counts as
committed, removal, retention, and the leftovers of interrupted saves (named with their writer's pid)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir, write_text_atomic
from lightning_resume._storage.kinds import FILE, Kind, Step, read_versions, unobserved
from lightning_resume._storage.manifest import MANIFEST_SUFFIX, DirectoryManifest, Entry, R, next_entries
from lightning_resume._storage.store import SAVE_PREFIX, LocalStore, Store

if TYPE_CHECKING:
    from lightning_resume._storage.writer import Aside

#: The steps of a commit, in order, as passed to its ``on_step`` observer (``mid_delete``: pruning).
COMMIT_STEPS = ("before_manifest", "before_rename", "before_swap", "after_swap", "mid_delete")
Checkpoints = Mapping[str, Entry | DirectoryManifest]  # name -> the version a checkpoint holds
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
    """:func:`commit` of what ``aside`` wrote as ``record`` (new fields, or a copy's ``Entry`` its bytes must
    match) before ``known`` (default: the manifest's), then retention; returns the entry, pruned names."""
    target = aside.target
    assert aside.path is not None, "commit_file after the with block of the Aside"
    try:
        if not isinstance(record, Entry):
            record = Entry.from_json({**record, "size": aside.size, "checksum": aside.checksum})
        elif (aside.size, aside.checksum) != (record.size, record.checksum):
            raise OSError(
                errno.EIO,
                f"{aside.size} bytes with checksum {aside.checksum} were written for {str(target)!r}, "
                f"expected {record.size} / {record.checksum}: not committed",
            )
        current = [known] if known is not None else held(target)
    except BaseException:
        aside.discard()
        raise
    commit(FILE, aside.path, target, next_entries(record, current))
    return record, prune(LocalStore(target.parent), FILE, keep) if keep is not None else []


def held(path: Path) -> list[Entry]:
    """The versions the manifest of the file ``path`` lists that its size matches (none without it)."""
    return FILE.held(LocalStore(path.parent), path.name)


def remove(store: Store, kind: Kind[R], name: str, on_step: Step = unobserved) -> None:
    """Delete checkpoint ``name``: first what would let a half-deleted one count."""
    for index, (part, folder) in enumerate(kind.removal(name)):
        if index:
            on_step("mid_delete")
        store.remove(part, tree=folder)


def prune(
    store: Store, kind: Kind[R], keep: int | None, current: str | None = None, on_step: Step = unobserved
) -> list[str]:
    """Remove what :func:`retention` names (never ``current``); return the names."""
    doomed = retention(store, kind, keep, current)
    for name in doomed:
        remove(store, kind, name, on_step)
    return doomed


def committed(store: Store, kind: Kind[R], sizes: Mapping[str, int] | None = None) -> dict[str, R]:
    """Committed checkpoints, each with its newest version whose files are all there with their sizes."""
    sizes = store.sizes(kind.directory) if sizes is None else sizes
    found: dict[str, R] = {}
    for name in kind.names(sizes):
        for record in read_versions(store, kind, name):
            if all(sizes.get(f.name) == f.size for f in kind.files(name, record)):
                found[name] = record
                break
    return found


def newest_first(checkpoints: Checkpoints, exclude: Iterable[str] = ()) -> list[str]:
    """Checkpoint names (files or directories) but ``exclude`` in fallback order: newest save first."""
    skipped = set(exclude)
    return sorted((n for n in checkpoints if n not in skipped), key=lambda n: (-checkpoints[n].saved_at, n))


def beyond_keep(checkpoints: Checkpoints, keep: int, family: Callable[[str], str]) -> list[str]:
    """Names beyond the newest ``keep`` of each family, in fallback order (raises ``ValueError`` below 1)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep!r}.")
    families: dict[str, list[str]] = defaultdict(list)
    for name in newest_first(checkpoints):
        families[family(name)].append(name)
    return sorted(n for members in families.values() for n in members[keep:])


def retention(store: Store, kind: Kind[R], keep: int | None, current: str | None = None) -> list[str]:
    """What retention deletes: committed checkpoints :func:`beyond_keep` and directories that no longer
    count, never ``current`` (an uncommitted file stays: the next save of its name replaces it)."""
    sizes = store.sizes(kind.directory)
    found = committed(store, kind, sizes)
    doomed = beyond_keep(found, keep, kind.family) if keep is not None else []
    if kind.directory:
        doomed += [n for n in kind.names(sizes) if n not in found]
    return sorted(n for n in doomed if n != current)


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
