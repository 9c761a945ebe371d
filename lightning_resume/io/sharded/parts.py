"""A sharded save: every rank fsyncs, hashes and records its files in ``.lr-part-<rank>.json``; one process
hashes the rest, builds the manifest and commits. The ranks meet in the part files, not in a collective."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir, fsync_file, temp_sibling
from lightning_resume._storage.catalog import verify
from lightning_resume._storage.commit import clean_stale, commit, prune
from lightning_resume._storage.kinds import MANIFEST_NAME, DirectoryKind, Step, resolve_pointer, unobserved
from lightning_resume._storage.manifest import DirectoryManifest, FileEntry, check_metadata, checksum_file
from lightning_resume._storage.store import LocalStore, walk_files

PART_PREFIX = ".lr-part-"
_OURS = (PART_PREFIX, TEMP_PREFIX)
#: DCP's global metadata and Lightning's non-tensor state: what a DCP checkpoint cannot load without.
DCP_METADATA = ".metadata"
LIGHTNING_META = "meta.pt"
DCP_REQUIRED = (DCP_METADATA, LIGHTNING_META)


def list_files(directory: Path) -> list[str]:
    """Every regular file under ``directory`` (relative, ``/``-separated, sorted), our own files left out."""
    names = {n: n.rsplit("/", 1)[-1] for n in walk_files(directory)}
    return sorted(n for n, base in names.items() if base != MANIFEST_NAME and not base.startswith(_OURS))


def dcp_files_of(directory: Path, rank: int) -> list[str]:
    """The files DCP's ``FileSystemWriter`` wrote for ``rank``: ``__<rank>_<n>.distcp``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(f"__{rank}_") and n.endswith(".distcp"))


def hash_files(directory: Path, names: Iterable[str]) -> list[FileEntry]:
    """Fsync and hash ``names`` under ``directory``."""
    entries = []
    for name in sorted(names):
        fsync_file(directory / name)
        entries.append(FileEntry(name, *checksum_file(directory / name)))
    return entries


def part_path(directory: Path, rank: int) -> Path:
    return directory / f"{PART_PREFIX}{rank}.json"


def write_part(directory: Path, rank: int, entries: Sequence[FileEntry], error: str | None = None) -> None:
    """Record the files ``rank`` hashed, or its ``error`` (not fsynced: a crash discards the directory)."""
    path = part_path(directory, rank)
    fd, temporary = temp_sibling(path)
    with os.fdopen(fd, "w") as handle:
        json.dump({"files": [asdict(e) for e in entries], "error": error}, handle)
    os.replace(temporary, path)


def read_parts(directory: Path, world_size: int) -> dict[str, FileEntry]:
    """Every rank's recorded files by name (``FileNotFoundError``, or ``RuntimeError`` for a failed rank)."""
    found: dict[str, FileEntry] = {}
    missing = []
    for rank in range(world_size):
        try:
            part = json.loads(part_path(directory, rank).read_text())
        except FileNotFoundError:
            missing.append(rank)
            continue
        if part.get("error"):
            raise RuntimeError(f"rank {rank} could not record its files: {part['error']}")
        found.update((e.name, e) for e in map(FileEntry.from_json, part["files"]))
    if missing:
        raise FileNotFoundError(f"rank(s) {missing} recorded no files in {str(directory)!r} yet")
    return found


def parts_complete(directory: Path, world_size: int) -> bool:
    """Whether every rank recorded its files (``RuntimeError`` when a rank recorded that it failed)."""
    try:
        read_parts(directory, world_size)
    except FileNotFoundError:
        return False
    return True


def build_manifest(
    directory: Path, world_size: int, required: Sequence[str] = (), **fields: Any
) -> DirectoryManifest:
    """The manifest of a save directory, with ``fields``; files no rank claimed are fsynced, hashed here."""
    claimed = read_parts(directory, world_size)
    names = list_files(directory)
    if missing := [n for n in required if n not in names]:
        raise FileNotFoundError(f"{str(directory)!r} has no {', '.join(missing)}: the save is incomplete")
    entries = {e.name: e for e in hash_files(directory, [n for n in names if n not in claimed])}
    entries.update({n: claimed[n] for n in names if n in claimed})
    for folder, _, _ in os.walk(directory):
        fsync_dir(folder)
    fields["metadata"] = dict(check_metadata(fields.get("metadata") or {}))
    files = tuple(entries[n] for n in sorted(entries))
    return DirectoryManifest(files, world_size=world_size, required=tuple(required), **fields)


def read_manifest(directory: Path) -> DirectoryManifest | None:
    """The manifest of a checkpoint directory (or a link to one), ``None`` when it has no readable one."""
    return verify(directory, DirectoryKind(), checksums=False).manifest


def commit_directory(
    save_dir: Path, pointer: Path, manifest: DirectoryManifest, keep: int, on_step: Step = unobserved
) -> Path:
    """Commit ``save_dir`` (its part files removed) as what ``pointer`` names, then prune to ``keep``."""
    for part in save_dir.glob(f"{PART_PREFIX}*"):
        part.unlink()
    kind = DirectoryKind(pointer.name)
    final = commit(kind, save_dir, pointer, [manifest], on_step=on_step)
    prune(LocalStore(pointer.parent), kind, keep, final.name, on_step)
    return final


def attempt(action: Callable[[], Any]) -> BaseException | None:
    """Run ``action``; return what it raised (DCP's errors are ``BaseException``s), or ``None``."""
    try:
        action()
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return e
    return None


def clean_up(pointer: Path, keep: int, restart: bool = False) -> list[str]:
    """Delete the leftovers of interrupted saves beside ``pointer`` and what retention names; return them."""
    target = resolve_pointer(pointer)
    removed = clean_stale(pointer.parent, restart)
    kind = DirectoryKind(pointer.name)
    return removed + prune(LocalStore(pointer.parent), kind, keep, target.name if target else None)
